"""What the gateway serves with: the model's tokenizer and context length, the cluster client, and
the readiness probe.

Contract:
- `load_model_info(spec, model_dir) -> ModelInfo(tokenizer, max_model_len)`: the tokenizer only
  (the weights stay on the nodes): "tiny" builds the tiny model's, a real model's converted folder
  (`prepare_model`, cached in `.models/`) gives `tokenizer.json` and `config.json`.
- `Backend(client, model, config)`: `start_generation(api_request, request_id, session_id, cache_salt)
  -> Generation` (tokenize, check the context, build SamplingParams, start the cluster request on the
  tenant-scoped `session_id`, its cached prompt prefixes scoped by `cache_salt`; ApiError 400 for what cannot run, and for anything the bus could
  not carry: `wire.Uncarriable` from `ClusterClient.generate`, naming the API field),
  `await readiness() -> dict` (cached for `ready_cache_s`).
Readiness: the broker has no query for its registry, so the gateway probes it with what it
already has: one deliberately empty request to each service (`prefill`, `decode`). No live node
-> the broker answers `no_node` at once; a live node answers `bad_request` without touching its
engine or KV (`overloaded` also proves a node is there). Costs two tiny messages per
`ready_cache_s`, nothing on the engines.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

from bus.constants import BROKER_STATS_SERVICE
from bus.mailbox import BusError, answer_map
from nodes.engines.base import SamplingParams
from nodes.gateway.api_errors import bad_request
from nodes.gateway.gateway_settings import GatewayConfig
from nodes.gateway.schema import ApiRequest, tokenize
from nodes.wire import Code, Uncarriable

PROBE_SERVICES = ("prefill", "decode")
PROBE_KEY = "pdbus-ready-probe"
PROBE_TIMEOUT_S = 2.0
ALIVE_CODES = {Code.BAD_REQUEST, Code.OVERLOADED, Code.FULL, Code.REJECTED}


@dataclass(frozen=True)
class ModelInfo:
    tokenizer: Any
    max_model_len: int


def load_model_info(spec: str, model_dir: str | None = None) -> ModelInfo:
    """The tokenizer and context length of `spec`, without torch or the weights (a converted
    folder is read as is; only a first start converts a GGUF, which does need torch)."""
    from nodes.engines import model_loader
    from nodes.engines.tokenizer import Tokenizer

    if spec == model_loader.TINY_SPEC:
        from nodes.engines.tiny import tiny_tokenizer
        return ModelInfo(tiny_tokenizer(model_loader.TINY_VOCAB_SIZE), model_loader.TINY_MAX_POSITIONS)
    if model_loader.is_random_spec(spec):
        from nodes.engines.random_model import random_max_len, random_tokenizer
        return ModelInfo(random_tokenizer(), random_max_len(spec))
    folder = model_loader.prepare_model(spec, model_dir=model_dir)
    config = json.loads((folder / "config.json").read_text())
    return ModelInfo(Tokenizer.from_folder(folder), int(config.get("max_position_embeddings", 2048)))


def _logprobs(request: ApiRequest) -> int | None:
    """What the client asked; at least the sampled token's own when `best_of` ranks the samples."""
    if request.logprobs is None and request.samples > request.n:
        return 0
    return request.logprobs


def _field_of(path: str, chat: bool) -> str:
    """The API field behind a cluster body path: `sampling.stop[1]` -> `stop`."""
    if path.startswith("prompt_token_ids"):
        return "messages" if chat else "prompt"
    name = path.removeprefix("sampling.").split(".")[0].split("[")[0]
    return {"stop_token_ids": "stop"}.get(name, name)


class Backend:
    def __init__(self, client: Any, model: ModelInfo, config: GatewayConfig) -> None:
        self.client, self.model, self.config = client, model, config
        self.max_model_len = min(filter(None, (config.max_model_len, model.max_model_len)))
        self._ready: dict[str, Any] | None = None
        self._ready_at = 0.0
        self._ready_lock = asyncio.Lock()

    def start_generation(self, request: ApiRequest, request_id: str, session_id: str, cache_salt: str = "",
                         choice: int = 0, fork: tuple[str, str] = ("", "")) -> Any:
        """The cluster request on `session_id` (the cluster's, tenant-scoped), its prompt's cached
        prefixes shared only under `cache_salt`; 400 for what it cannot run, including anything the
        bus could not carry (the last guard before the bus). `choice` k of `n` samples with seed
        `seed + k` (when a seed is given), so the n choices differ and each is reproducible;
        `fork` (group, routing key): the n choices of one prompt, routed together so the later ones
        may decode from the first one's KV (nodes/decode_forks.py)."""
        ids, max_tokens = tokenize(request, self.model.tokenizer, self.max_model_len, self.config.default_max_tokens)
        self._check_bias(request)
        try:
            seed = None if request.seed is None else (request.seed + choice) % (2 ** 64)
            sampling = SamplingParams(temperature=request.temperature, top_k=request.top_k, top_p=request.top_p,
                                      seed=seed, max_tokens=max(1, max_tokens), stop=request.stop,
                                      ignore_eos=request.ignore_eos, logprobs=_logprobs(request),
                                      prompt_logprobs=request.logprobs if request.echo else None,
                                      presence_penalty=request.presence_penalty,
                                      frequency_penalty=request.frequency_penalty,
                                      repetition_penalty=request.repetition_penalty, logit_bias=request.logit_bias,
                                      grammar=request.grammar)
            return self.client.generate(ids, sampling, session_id=session_id, request_id=request_id,
                                        cache_salt=cache_salt, fork_group=fork[0], route_key=fork[1])
        except Uncarriable as exc:
            raise bad_request(f"the request cannot be sent to the cluster: {exc.why}",
                              _field_of(exc.path, request.chat)) from None
        except ValueError as exc:
            raise bad_request(str(exc)) from exc

    def _check_bias(self, request: ApiRequest) -> None:
        vocab = self.model.tokenizer.vocab_size
        if any(token >= vocab for token, _ in request.logit_bias):
            raise bad_request(f"'logit_bias' token ids must be in [0, {vocab})", "logit_bias")

    async def readiness(self) -> dict[str, Any]:
        async with self._ready_lock:
            if self._ready is None or time.monotonic() - self._ready_at >= self.config.ready_cache_s:
                services = await asyncio.gather(*(self._probe(s) for s in PROBE_SERVICES))
                self._ready = dict(zip(PROBE_SERVICES, services, strict=True))
                self._ready_at = time.monotonic()
            return {"ready": all(self._ready.values()), "broker": self.client.bus.endpoint.registered,
                    "services": dict(self._ready)}

    async def broker_stats(self) -> dict[str, Any] | None:
        """The broker's live nodes by role and queue depths (its built-in stats service); None
        when the broker does not answer in time."""
        if not self.client.bus.endpoint.registered:
            return None
        return await answer_map(self.client.bus.stream(BROKER_STATS_SERVICE, {}, timeout=PROBE_TIMEOUT_S))

    async def _probe(self, service: str) -> bool:
        if not self.client.bus.endpoint.registered:
            return False
        # Deliberately no valid body of the service: a live node refuses it without touching its engine.
        stream = self.client.bus.stream(service, {"type": "probe"}, key=PROBE_KEY, timeout=PROBE_TIMEOUT_S)
        try:
            async for _ in stream:
                return True   # a node answered something: it is alive
        except BusError as exc:
            return exc.code in ALIVE_CODES
        except TimeoutError:
            return False
        finally:
            stream.cancel()
        return True
