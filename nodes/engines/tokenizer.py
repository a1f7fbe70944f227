"""Text <-> token ids for the engines, on top of the `tokenizers` library (no transformers).

Contract:
- `Tokenizer(backend, bos_token_id=, eos_token_ids=, chat_template=, special_tokens=)` wraps a
  `tokenizers.Tokenizer`; `encode`, `decode`, `apply_chat_template` and `new_detokenizer` are what
  engines and nodes call. `vocab_size` counts the tokenizer's ids (it may be below the model's
  embedding rows, which are padded).
- `Tokenizer.from_folder(folder)` / `save(folder)` read and write the Hugging Face files
  (`tokenizer.json`, `tokenizer_config.json` with the chat template, `special_tokens_map.json`) so a
  saved folder also loads in transformers; a bad folder raises `TokenizerLoadError`.
- `IncrementalDetokenizer.push(token_id)` returns only text that is final: it holds back while the
  decoded tail is an incomplete UTF-8 sequence, so a stream never shows a half character; `flush()`
  returns whatever is held. The concatenation of every `push` and the final `flush` equals
  `tokenizer.decode(all_ids)` exactly.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as BackendTokenizer

from nodes.engines.chat_template import ChatTemplate

REPLACEMENT_CHAR = "\ufffd"
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")


class TokenizerLoadError(ValueError):
    """A tokenizer folder is missing files or holds files that do not parse."""


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

    def save(self, folder: Path, *, model_max_length: int) -> None:
        self.backend.save(str(folder / "tokenizer.json"))
        special = {k: v for k, v in self.special_tokens.items() if v is not None}
        added = [t.content for t in self.backend.get_added_tokens_decoder().values() if t.special]
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            **special,
            "additional_special_tokens": [t for t in added if t not in special.values()],
            "add_bos_token": False,
            "add_prefix_space": False,
            "clean_up_tokenization_spaces": False,
            "model_max_length": model_max_length,
            "chat_template": self.chat_template_source,
        }
        _write_json(folder / "tokenizer_config.json", config)
        _write_json(folder / "special_tokens_map.json", special)

    @classmethod
    def from_folder(cls, folder: Path, *, bos_token_id: int | None = None,
                    eos_token_ids: Sequence[int] = ()) -> Tokenizer:
        """Load `tokenizer.json` (+ `tokenizer_config.json`); ids not given come from the token strings."""
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise TokenizerLoadError(f"{path} is missing (pdbus needs a fast tokenizer's tokenizer.json)")
        try:
            backend = BackendTokenizer.from_file(str(path))
        except Exception as exc:  # the Rust side raises plain Exception on malformed JSON
            raise TokenizerLoadError(f"{path} does not parse: {exc}") from exc
        config = _read_json(folder / "tokenizer_config.json")
        special = {name: _token_content(config.get(name)) for name in SPECIAL_TOKEN_NAMES}
        if bos_token_id is None and special["bos_token"]:
            bos_token_id = backend.token_to_id(special["bos_token"])
        if not eos_token_ids and special["eos_token"]:
            eos_token_id = backend.token_to_id(special["eos_token"])
            if eos_token_id is not None:
                eos_token_ids = (eos_token_id,)
        return cls(backend, bos_token_id=bos_token_id, eos_token_ids=eos_token_ids,
                   chat_template=_chat_template(folder, config), special_tokens=special)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TokenizerLoadError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise TokenizerLoadError(f"{path} must hold a JSON object")
    return value


def _write_json(path: Path, value: dict[str, Any]) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _token_content(value: Any) -> str | None:
    # tokenizer_config.json spells a special token as a string or as an AddedToken dict.
    return value.get("content") if isinstance(value, dict) else value


def _chat_template(folder: Path, config: dict[str, Any]) -> str | None:
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    jinja_file = folder / "chat_template.jinja"  # where transformers 5 saves it
    if template is None and jinja_file.is_file():
        template = jinja_file.read_text(encoding="utf-8")
    return template


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
