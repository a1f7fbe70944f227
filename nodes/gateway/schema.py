"""Validate an OpenAI completions / chat completions request body into an `ApiRequest` (pure).

Contract: `parse_request(body, chat=..., config=..., session_header=None) -> ApiRequest` or
`ApiError` (400) naming the offending field. Accepted: `model` (must be the served name),
`prompt` (a string, a list of token ids, or a list of up to MAX_PROMPTS of either) or `messages`
(role + string content or text parts; tool calls and tool results), `max_tokens` (chat also
`max_completion_tokens`; 0 with `echo`), `temperature`, `top_p`, `top_k`, `seed`, `stop`, `n`
and `best_of` (>= n, not streamed), `logprobs` / `top_logprobs`, `echo`, the penalties and
`logit_bias`, `stream`, `stream_options.include_usage`, `user`, `ignore_eos` (vLLM's extension),
`session_id` (or the `X-Session-Id` header; visible ASCII, at most MAX_SESSION_ID_CHARS), and the
output constraints of nodes/gateway/structured.py. Every value is held to what the cluster's bus
carries (nodes/gateway/fields.py: UTF-8 text, 64-bit integers, finite numbers, at most MAX_DEPTH
levels of nesting), so an accepted request can always be sent. `suffix` is refused clearly; any
other field is ignored and listed in `ignored_fields` (the caller logs them; printable ASCII, at
most 32), as vLLM does.
`tokenize(request, tokenizer, max_model_len)` turns it into prompt token ids and checks the
context length (400 `context_length_exceeded`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from nodes.engines.engine_types import (
    MAX_BIAS,
    MAX_LOGIT_BIAS,
    MAX_LOGPROBS,
    MAX_PENALTY,
    MAX_REPETITION_PENALTY,
)
from nodes.engines.grammar_spec import GrammarSpec
from nodes.gateway import fields, structured
from nodes.gateway.api_errors import ApiError, bad_request
from nodes.gateway.fields import MAX_DEPTH, MAX_SESSION_ID_CHARS, boolean, integer, number, string, text
from nodes.gateway.tool_calls import ToolConfig
from nodes.gateway.tool_prompt import render_prompt, template_messages

__all__ = ["MAX_DEPTH", "MAX_SESSION_ID_CHARS", "ApiRequest", "parse_request", "tokenize"]

COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "n", "stream",
          "stream_options", "user", "ignore_eos", "session_id", "logprobs", "presence_penalty",
          "frequency_penalty", "best_of", "echo", "suffix", "max_completion_tokens", "top_logprobs",
          "tools", "tool_choice", "logit_bias", "repetition_penalty"}
MAX_STOPS = 8
MAX_STOP_CHARS = 1024
MAX_N = 16                 # choices per prompt (`n`)
MAX_PROMPTS = 64           # prompts in one completions request
MAX_CHOICES = 64           # prompts x n


@dataclass(frozen=True)
class ApiRequest:
    chat: bool
    model: str
    prompt: str | None = None
    prompt_token_ids: tuple[int, ...] | None = None
    messages: tuple[dict, ...] | None = None
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    user: str | None = None
    ignore_eos: bool = False
    session_id: str | None = None
    ignored_fields: tuple[str, ...] = field(default=())
    more_prompts: tuple[str | tuple[int, ...], ...] = ()   # completions: the batch's other prompts
    n: int = 1
    best_of: int | None = None         # samples per prompt when more than n (the best n are returned)
    logprobs: int | None = None        # alternatives per token (chat: `top_logprobs` when `logprobs`)
    echo: bool = False                 # completions: the prompt, and its logprobs, before the completion
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0    # vLLM's extension
    logit_bias: tuple[tuple[int, float], ...] = ()
    grammar: GrammarSpec | None = None       # response_format, guided_*, or a forced tool call
    tools: ToolConfig | None = None          # chat: the tools offered and tool_choice

    @property
    def num_prompts(self) -> int:
        return 1 + len(self.more_prompts)

    @property
    def samples(self) -> int:
        """Cluster requests per prompt: `best_of` when given, else `n`."""
        return self.best_of or self.n

    def prompt_item(self, index: int) -> ApiRequest:
        """This request for its `index`-th prompt alone (completions batches)."""
        if index == 0:
            return self
        item = self.more_prompts[index - 1]
        text, ids = (item, None) if isinstance(item, str) else (None, item)
        return replace(self, prompt=text, prompt_token_ids=ids, more_prompts=())


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad_request("'stop' must be a string or a list of strings", "stop")
    if len(stops) > MAX_STOPS:
        raise bad_request(f"'stop' takes at most {MAX_STOPS} strings", "stop")
    if any(len(s) > MAX_STOP_CHARS for s in stops):   # what a decode node accepts (nodes/wire/request_readers.py)
        raise bad_request(f"each 'stop' string has at most {MAX_STOP_CHARS} characters", "stop")
    return tuple(text(s, "stop") for s in stops if s)


def _best_of(body: dict, n: int) -> int | None:
    """`best_of` k >= n samples, of which the n with the highest total logprob are returned."""
    best_of = integer(body, "best_of", 1, MAX_N)
    if best_of is not None and best_of < n:
        raise bad_request(f"'best_of' must be at least n ({n})", "best_of")
    if best_of is not None and best_of > n and boolean(body, "stream"):
        raise bad_request("'best_of' above n is not streamed (its choices are known at the end)", "best_of")
    return best_of


def _refuse_unsupported(body: dict, chat: bool) -> None:
    if body.get("suffix"):
        raise bad_request("'suffix' is not supported", "suffix")
    if body.get("parallel_tool_calls") not in (None, True, False):
        raise bad_request("'parallel_tool_calls' must be a boolean", "parallel_tool_calls")
    if chat and body.get("echo") not in (None, False):
        raise bad_request("'echo' is a completions field", "echo")


def _logprobs(body: dict, chat: bool) -> int | None:
    """Completions: `logprobs` k (0..20). Chat: `logprobs` true, `top_logprobs` k (0..20)."""
    if not chat:
        return integer(body, "logprobs", 0, MAX_LOGPROBS)
    wanted = boolean(body, "logprobs")
    top = integer(body, "top_logprobs", 0, MAX_LOGPROBS)
    if top is not None and not wanted:
        raise bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    return (top or 0) if wanted else None


def _logit_bias(body: dict) -> tuple[tuple[int, float], ...]:
    bias = body.get("logit_bias")
    if bias is None:
        return ()
    if not isinstance(bias, dict) or len(bias) > MAX_LOGIT_BIAS:
        raise bad_request(f"'logit_bias' must map at most {MAX_LOGIT_BIAS} token ids to biases", "logit_bias")
    pairs = []
    for key in bias:
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and int(key) <= fields.MAX_TOKEN_ID):
            raise bad_request(f"'logit_bias' keys are token ids, got {fields.shown(key)}", "logit_bias")
        pairs.append((int(key), number(bias, key, 0.0, -MAX_BIAS, MAX_BIAS)))
    return tuple(sorted(pairs))


def _prompts(body: dict) -> list[tuple[str | None, tuple[int, ...] | None]]:
    """A batch: a list of strings, or a list of token-id lists; otherwise one prompt."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
        if len(prompt) > MAX_PROMPTS:
            raise bad_request(f"at most {MAX_PROMPTS} prompts per request", "prompt")
        return [_prompt(item) for item in prompt]
    return [_prompt(prompt)]


def _prompt(prompt: Any) -> tuple[str | None, tuple[int, ...] | None]:
    if isinstance(prompt, str):
        if not prompt:
            raise bad_request("'prompt' must not be empty", "prompt")
        return text(prompt, "prompt"), None
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return None, fields.token_ids(prompt)
    if prompt is None:
        raise bad_request("'prompt' is required", "prompt")
    raise bad_request("'prompt' must be a non-empty string or list of token ids", "prompt")


def _content(content: Any, index: int) -> str:
    if isinstance(content, str):
        return text(content, "messages")
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return text("".join(p["text"] for p in content), "messages")
    raise bad_request(f"messages[{index}].content must be a string or a list of text parts", "messages")


def _messages(body: dict) -> tuple[dict, ...]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list", "messages")
    if any(isinstance(m, dict) and (m.get("role") == "tool" or m.get("tool_calls")) for m in messages):
        template_messages(messages, native=False)   # validates (400 naming messages); rendered at tokenize
        return tuple(messages)
    parsed = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("system", "user", "assistant", "developer"):
            raise bad_request(f"messages[{index}] needs a role of system, user or assistant", "messages")
        parsed.append({"role": message["role"], "content": _content(message.get("content"), index)})
    if not any(m["content"] for m in parsed):
        raise bad_request("'messages' must not all be empty", "messages")
    return tuple(parsed)


def _max_tokens(body: dict, chat: bool, limit: int, echo: bool = False) -> int | None:
    """At least 1; 0 only with `echo` (the prompt scored, nothing generated)."""
    value = integer(body, "max_tokens", 0 if echo else 1, fields.INT64_MAX)
    if chat and value is None:
        value = integer(body, "max_completion_tokens", 1, fields.INT64_MAX)
    if value is not None and value > limit:
        raise bad_request(f"'max_tokens' is {value}, above this server's limit of {limit}", "max_tokens")
    return value


def parse_request(body: Any, *, chat: bool, model_name: str, max_tokens_limit: int,
                  session_header: str | None = None) -> ApiRequest:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    fields.check_depth(body)
    model = _model(body, model_name)
    _refuse_unsupported(body, chat)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise bad_request("'stream_options' must be an object", "stream_options")
    prompts = [(None, None)] if chat else _prompts(body)
    (prompt, token_ids), n = prompts[0], integer(body, "n", 1, MAX_N) or 1
    best_of = _best_of(body, n)
    if len(prompts) * (best_of or n) > MAX_CHOICES:
        raise bad_request(f"prompts x n (or best_of) is at most {MAX_CHOICES}", "n")
    echo = False if chat else boolean(body, "echo")
    known = COMMON | structured.FIELDS | ({"messages"} if chat else {"prompt"})
    grammar, tools = structured.read_structured(body, chat)
    return ApiRequest(
        grammar=grammar, tools=tools,
        more_prompts=tuple(text if text is not None else ids for text, ids in prompts[1:]),  # type: ignore[misc]
        n=n, best_of=best_of, logprobs=_logprobs(body, chat), echo=echo,
        presence_penalty=number(body, "presence_penalty", 0.0, -MAX_PENALTY, MAX_PENALTY),
        frequency_penalty=number(body, "frequency_penalty", 0.0, -MAX_PENALTY, MAX_PENALTY),
        repetition_penalty=number(body, "repetition_penalty", 1.0, 1e-9, MAX_REPETITION_PENALTY), logit_bias=_logit_bias(body),
        chat=chat, model=model, prompt=prompt, prompt_token_ids=token_ids,
        messages=_messages(body) if chat else None, max_tokens=_max_tokens(body, chat, max_tokens_limit, echo),
        temperature=number(body, "temperature", 1.0, 0.0, 2.0), top_p=number(body, "top_p", 1.0, 1e-9, 1.0),
        top_k=max(0, integer(body, "top_k", -1, fields.MAX_TOKEN_ID) or 0),
        seed=integer(body, "seed", fields.INT64_MIN, fields.INT64_MAX),
        stop=_stop(body), stream=boolean(body, "stream"),
        include_usage=bool(options and boolean(options, "include_usage")),
        user=string(body, "user"), ignore_eos=boolean(body, "ignore_eos"),
        session_id=fields.session_id(body, session_header), ignored_fields=fields.field_names(set(body) - known))


def _model(body: dict, model_name: str) -> str:
    model = body.get("model")
    if not isinstance(model, str):
        raise bad_request("'model' is required and must be a string", "model")
    if text(model, "model") != model_name:
        raise ApiError(404, f"the model {fields.shown(model)} does not exist; this server serves '{model_name}'",
                       param="model", code="model_not_found")
    return model


def _chat_prompt(request: ApiRequest, tokenizer: Any) -> str:
    messages = list(request.messages or ())
    with_tools = request.tools is not None and (request.tools.offered or any(
        m.get("role") == "tool" or m.get("tool_calls") for m in messages))
    if with_tools:
        assert request.tools is not None
        return render_prompt(tokenizer, messages, request.tools)
    try:
        return tokenizer.apply_chat_template(messages)
    except Exception as exc:   # a template that raises (e.g. roles out of order) is the client's input
        raise bad_request(f"the messages do not fit the model's chat template: {exc}", "messages") from exc


def tokenize(request: ApiRequest, tokenizer: Any, max_model_len: int, default_max_tokens: int
             ) -> tuple[tuple[int, ...], int]:
    """(prompt token ids, max_tokens) for the request; 400 when it cannot fit the context."""
    if request.chat:
        ids = tuple(tokenizer.encode(_chat_prompt(request, tokenizer)))
    elif request.prompt_token_ids is not None:
        ids = request.prompt_token_ids
        if any(t < 0 or t >= tokenizer.vocab_size for t in ids):
            raise bad_request(f"token ids must be in [0, {tokenizer.vocab_size})", "prompt")
    else:
        ids = tuple(tokenizer.encode(request.prompt))
    if not ids:
        raise bad_request("the prompt is empty after tokenization", "prompt")
    room = max_model_len - len(ids)
    if room < 1:
        raise bad_request(f"this model's maximum context length is {max_model_len} tokens; the prompt has "
                          f"{len(ids)}", "prompt" if not request.chat else "messages", "context_length_exceeded")
    max_tokens = request.max_tokens if request.max_tokens is not None else min(default_max_tokens, room)
    if max_tokens > room:
        raise bad_request(f"this model's maximum context length is {max_model_len} tokens; you requested "
                          f"{len(ids) + max_tokens} ({len(ids)} in the prompt, {max_tokens} to generate)",
                          "max_tokens", "context_length_exceeded")
    return ids, max_tokens
