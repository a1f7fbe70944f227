"""The two grammar libraries `harness/bench/grammar_mask.py` compares, behind one interface.

Contract: `XgrammarAdapter(tokenizer, vocab_size)` and `LlguidanceAdapter(tokenizer, vocab_size)`
take a pdbus tokenizer (nodes/engines/tokenizer.py: its `backend`, `eos_token_ids`) and build the
library's tokenizer object (the cost the bench times as `tokenizer_s`); each then offers
- `compile(source)`: a compiled grammar for a JSON schema text ("" for any JSON object); schemas
  emit json.dumps's `SEPARATORS` and no other whitespace; no library cache is kept;
- `new_state(compiled)`: a fresh per-request matcher;
- `fill(state, bitmask, row)`: the allowed-token bits into row `row` of an int32 torch bitmask;
- `accept(state, token) -> bool`: advance by one token (False: refused).
The libraries are imported when an adapter is built: only llguidance is a dependency.
"""

from __future__ import annotations

from typing import Any

SEPARATORS = (", ", ": ")  # json.dumps's defaults: what pdbus asks both libraries to emit


class XgrammarAdapter:
    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        import xgrammar as xgr
        self.xgr = xgr
        vocab = tokenizer.backend.get_vocab(with_added_tokens=True)
        specials = {t.content for t in tokenizer.backend.get_added_tokens_decoder().values() if t.special}
        encoded = [""] * tokenizer.vocab_size  # "" marks a special token, never allowed inside text
        for text, index in vocab.items():
            encoded[index] = "" if text in specials else text
        meta = xgr.TokenizerInfo._detect_metadata_from_hf(tokenizer.backend.to_str())
        info = xgr.TokenizerInfo(encoded, meta["vocab_type"], vocab_size=vocab_size,
                                 stop_token_ids=list(tokenizer.eos_token_ids),
                                 add_prefix_space=meta["add_prefix_space"])
        self.compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)

    def compile(self, source: str) -> Any:
        if not source:
            return self.compiler.compile_builtin_json_grammar()
        return self.compiler.compile_json_schema(source, any_whitespace=False, separators=SEPARATORS)

    def new_state(self, compiled: Any) -> Any:
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, state: Any, bitmask: Any, row: int) -> None:
        state.fill_next_token_bitmask(bitmask, row)

    def accept(self, state: Any, token: int) -> bool:
        return state.accept_token(token)


class LlguidanceAdapter:
    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        import llguidance
        self.llg = llguidance
        self.tokenizer = llguidance.LLTokenizer(tokenizer.backend.to_str(), n_vocab=vocab_size,
                                                eos_token=list(tokenizer.eos_token_ids))
        self.options = {"whitespace_flexible": False, "item_separator": SEPARATORS[0],
                        "key_separator": SEPARATORS[1]}

    def compile(self, source: str) -> Any:
        grammar = self.llg.LLMatcher.grammar_from_json_schema(source or '{"type": "object"}',
                                                               overrides=self.options)  # type: ignore[arg-type]
        matcher = self.llg.LLMatcher(self.tokenizer, grammar, log_level=0)
        assert not matcher.is_error(), matcher.get_error()
        return matcher

    def new_state(self, compiled: Any) -> Any:
        return compiled.deep_copy()  # a cached matcher copied per request: its lexer is shared

    def fill(self, state: Any, bitmask: Any, row: int) -> None:
        view = bitmask[row]
        state.unsafe_compute_mask_ptr(view.data_ptr(), view.numel() * 4)

    def accept(self, state: Any, token: int) -> bool:
        return state.consume_token(token)
