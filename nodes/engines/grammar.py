"""Structured output for the engines: compile a `GrammarSpec`, track a request, mask its logits.

Contract (llguidance underneath; docs/STRUCTURED_OUTPUT.md says why it and not xgrammar):
- `GrammarCompiler(tokenizer, vocab_size, *, cache_size=64)`: one per engine. `vocab_size` is the
  logits' width; ids the tokenizer lacks (padded rows) are never allowed. The EOS ids it stops on
  are `tokenizer.eos_token_ids` (ValueError if there are none).
  `compile(spec) -> CompiledGrammar`: validates the spec, then compiles it, caching the last
  `cache_size` specs (LRU); anything the library refuses (an unimplemented schema keyword, a bad
  regex, a grammar over its size limits) is a ValueError with a short message for the client.
  `new_state(spec, replay=())`: a fresh `GrammarState`, advanced by `replay` (the tokens a stream
  already delivered, when a decode node resumes it after a failover); ValueError if one of them
  does not fit the grammar.
- `GrammarState`, one per request, single-threaded:
  `accept(token) -> bool` advances by one sampled token; False (and no change) if the grammar does
  not allow it: a caller bug or a replay mismatch. `is_terminated()`: nothing but EOS is allowed
  now (the output is complete; the engine ends the request) or EOS was accepted. `error`: "" or why
  the library gave up (a resource limit met mid-stream, or a panic of its Rust code); it then
  allows only EOS and is terminated.
  `fill_bitmask(bitmask, row)` writes the allowed tokens into row `row` of an int32 bitmask from
  `grammar_bitmask.allocate_bitmask`; `allowed_mask()` is the same as a bool tensor [vocab_size].
- `apply_masks(logits [batch, vocab], states)`: in place, every row whose state is not None keeps
  only the logits its grammar allows (the rest become -inf); rows with None are untouched.
  After it, any sampler (greedy or random) picks an allowed token; the caller then `accept`s it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

import llguidance
import torch
from tokenizers import Tokenizer as BackendTokenizer

from nodes.engines.grammar_bitmask import allocate_bitmask, apply_bitmask, unpack_bitmask
from nodes.engines.grammar_check import grammar_text, guarded, parser_limits, short
from nodes.engines.grammar_spec import GrammarSpec
from nodes.engines.tokenizer import Tokenizer


class CompiledGrammar:
    """A compiled spec: a matcher that is never advanced, copied for each request."""

    def __init__(self, spec: GrammarSpec, template: Any) -> None:
        self.spec = spec
        self._template = template

    def new_matcher(self) -> Any:
        return self._template.deep_copy()


class GrammarCompiler:
    def __init__(self, tokenizer: Tokenizer, vocab_size: int, *, cache_size: int = 64) -> None:
        if not tokenizer.eos_token_ids:
            raise ValueError("structured output needs the tokenizer's EOS token ids; this tokenizer has none")
        # The mask covers the tokenizer's ids too when it has more than the logits (apply trims).
        self.vocab_size = vocab_size
        self.mask_vocab_size = max(vocab_size, tokenizer.vocab_size)
        self.eos_token_ids = tuple(tokenizer.eos_token_ids)
        self._tokenizer = llguidance.LLTokenizer(_plain_json(tokenizer), n_vocab=self.mask_vocab_size,
                                                 eos_token=list(self.eos_token_ids))
        self._limits = parser_limits()
        self._cache: OrderedDict[GrammarSpec, CompiledGrammar] = OrderedDict()
        self._cache_size = cache_size

    def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        compiled = self._cache.get(spec)
        if compiled is not None:
            self._cache.move_to_end(spec)
            return compiled
        compiled = CompiledGrammar(spec, self._matcher(grammar_text(spec.validate())))
        self._cache[spec] = compiled
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return compiled

    def new_state(self, spec: GrammarSpec, replay: Iterable[int] = ()) -> GrammarState:
        state = GrammarState(self.compile(spec).new_matcher(), self.mask_vocab_size, self.eos_token_ids)
        for position, token in enumerate(replay):
            if not state.accept(token):
                raise ValueError(f"token {token} at position {position} does not fit the {spec.kind} grammar")
        return state

    @property
    def num_cached(self) -> int:
        return len(self._cache)

    def _matcher(self, grammar: str) -> Any:
        matcher = guarded(llguidance.LLMatcher, self._tokenizer, grammar, log_level=0, limits=self._limits)
        if matcher.is_error():
            raise ValueError(f"the grammar does not compile: {short(matcher.get_error())}")
        return matcher


def _plain_json(tokenizer: Tokenizer) -> str:
    """The tokenizer as tokenizer.json text without padding or truncation (as llguidance's own
    Hugging Face loader does: they would change how it tokenizes text); the engine's is untouched."""
    backend = BackendTokenizer.from_str(tokenizer.backend.to_str())
    backend.no_padding()
    backend.no_truncation()
    return backend.to_str()


class GrammarState:
    def __init__(self, matcher: Any, vocab_size: int, eos_token_ids: tuple[int, ...]) -> None:
        self._matcher = matcher
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self.num_accepted = 0
        self._failure = ""  # a library panic: the state then allows only EOS, as its own errors do

    def accept(self, token: int) -> bool:
        if token in self.eos_token_ids and self.is_terminated():
            pass  # the one token a finished grammar allows, though llguidance consumes nothing more
        # An out-of-range id would put the matcher into its (permanent) error state: refuse it here.
        elif not 0 <= token < self.vocab_size or self._failure or self._guarded(
                self._matcher.try_consume_tokens, [token]) != 1:
            return False
        self.num_accepted += 1
        return True

    def is_terminated(self) -> bool:
        return bool(self._failure) or bool(self._matcher.is_stopped())

    def is_accepting(self) -> bool:
        """EOS is allowed now (the output so far is a complete match)."""
        return bool(self._matcher.is_accepting())

    @property
    def error(self) -> str:
        return self._failure or (short(self._matcher.get_error()) if self._matcher.is_error() else "")

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        if bitmask.dtype != torch.int32 or bitmask.device.type != "cpu" or bitmask.dim() != 2:
            raise ValueError("the bitmask must be a 2-D int32 CPU tensor")
        target = bitmask[row]
        if not target.is_contiguous() or target.numel() * 32 < self.vocab_size:
            raise ValueError(f"bitmask row {row} is not a contiguous row of {(self.vocab_size + 31) // 32} words")
        if not self._failure:
            self._guarded(self._matcher.unsafe_compute_mask_ptr, target.data_ptr(), target.numel() * 4)
        if self._failure:
            target.zero_()
            for token in self.eos_token_ids:
                target[token // 32] |= 1 << (token % 32) if token % 32 < 31 else -(1 << 31)

    def _guarded(self, call: Any, *args: Any) -> Any:
        try:
            return guarded(call, *args)
        except ValueError as exc:
            self._failure = str(exc)
            return None

    def allowed_mask(self) -> torch.Tensor:
        bitmask = allocate_bitmask(1, self.vocab_size)
        self.fill_bitmask(bitmask, 0)
        return torch.from_numpy(unpack_bitmask(bitmask, self.vocab_size)[0].copy())

    def allowed_tokens(self) -> list[int]:
        return self.allowed_mask().nonzero().flatten().tolist()


def apply_masks(logits: torch.Tensor, states: Sequence[GrammarState | None]) -> None:
    if logits.dim() != 2 or logits.shape[0] != len(states):
        raise ValueError(f"logits {tuple(logits.shape)} for {len(states)} states")
    rows = [i for i, state in enumerate(states) if state is not None]
    if not rows:
        return
    mask_vocab = max(states[i].vocab_size for i in rows)  # type: ignore[union-attr]
    bitmask = allocate_bitmask(len(rows), mask_vocab)
    for k, i in enumerate(rows):
        states[i].fill_bitmask(bitmask, k)  # type: ignore[union-attr]
    apply_bitmask(logits, bitmask, rows)

