"""Text <-> token ids for the engines, on top of the `tokenizers` library (no transformers).

Contract:
- `Tokenizer(backend, bos_token_id=, eos_token_ids=, chat_template=, special_tokens=)` wraps a
  `tokenizers.Tokenizer`; `encode`, `decode`, `apply_chat_template` and `new_detokenizer` are what
  engines and nodes call. `vocab_size` counts the tokenizer's ids (it may be below the model's
  embedding rows, which are padded).
- `IncrementalDetokenizer.push(token_id)` returns only text that is final: it holds back while the
  decoded tail is an incomplete UTF-8 sequence, so a stream never shows a half character; `flush()`
  returns whatever is held. The concatenation of every `push` and the final `flush` equals
  `tokenizer.decode(all_ids)` exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer as BackendTokenizer

from nodes.engines.chat_template import ChatTemplate

REPLACEMENT_CHAR = "\ufffd"


class Tokenizer:
    def __init__(self, backend: BackendTokenizer, *, bos_token_id: int | None,
                 eos_token_ids: Sequence[int], chat_template: str | None,
                 special_tokens: dict[str, str | None] | None = None) -> None:
        self.backend = backend
        self.bos_token_id = bos_token_id
        self.eos_token_ids = tuple(eos_token_ids)
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        # bos_token / eos_token / ... strings, which chat templates may reference by name.
        self.special_tokens = dict(special_tokens or {})
        self.chat_template_source = chat_template
        self._chat_template = ChatTemplate(chat_template) if chat_template else None

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def apply_chat_template(self, messages: list[dict], *, add_generation_prompt: bool = True) -> str:
        if self._chat_template is None:
            raise ValueError("this tokenizer has no chat template; send a plain prompt instead")
        return self._chat_template.render(messages, add_generation_prompt=add_generation_prompt,
                                          **self.special_tokens)

    def new_detokenizer(self, *, skip_special_tokens: bool = True) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self, skip_special_tokens=skip_special_tokens)


class IncrementalDetokenizer:
    """Streams text for ids pushed one at a time, decoding only a short window per step.

    The window starts at the last point where all text before it was final; decoding the window
    and subtracting its already-emitted prefix keeps each step O(window), not O(sequence). Written
    here rather than using `tokenizers.decoders.DecodeStream` because that has no `flush`: bytes of
    an unfinished character at the end of a stream would be lost, while `decode` shows them as U+FFFD.
    """

    def __init__(self, tokenizer: Tokenizer, *, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._ids: list[int] = []
        self._prefix_offset = 0  # window start: text of ids before it is final
        self._read_offset = 0  # ids up to here have had their text emitted

    def push(self, token_id: int) -> str:
        self._ids.append(int(token_id))
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        window_text = self._decode(self._prefix_offset, len(self._ids))
        if len(window_text) <= len(prefix_text) or window_text.endswith(REPLACEMENT_CHAR):
            return ""  # nothing new yet, or the tail is an unfinished UTF-8 sequence
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        return window_text[len(prefix_text):]

    def flush(self) -> str:
        """The held-back tail (U+FFFD for bytes that never completed a character)."""
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        window_text = self._decode(self._prefix_offset, len(self._ids))
        self._prefix_offset = self._read_offset = len(self._ids)
        return window_text[len(prefix_text):]

    @property
    def token_ids(self) -> list[int]:
        return list(self._ids)

    def _decode(self, start: int, end: int) -> str:
        if start >= end:
            return ""
        return self._tokenizer.decode(self._ids[start:end], skip_special_tokens=self._skip_special)
