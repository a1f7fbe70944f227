"""Tokenizer: the real SmolLM2 tokenizer against transformers' GGUF tokenizer, the incremental
detokenizer's exactness, and the chat template against transformers' apply_chat_template."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodes.engines.model_loader import build_tiny_model, packaged_gguf_path

TEXTS = [
    "Hello world",
    "The year 2024 had 366 days; 3.14159 ≈ π.",
    "ünïcødé Ωμέγα, 中文字符, 日本語のテキスト, हिन्दी, עברית, العربية",
    "emoji 😀👍🏽 🇫🇷 👨‍👩‍👧 and ✨",
    "  leading, trailing   and   inner spaces  \n\n\ttabs\r\nCRLF\n",
    "def fib(n: int) -> int:\n    return n if n < 2 else fib(n - 1) + fib(n - 2)  # O(2^n)\n",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<repo_name>pdbus<file_sep>main.py<|endoftext|>",
    "I'm sure you're right, they'll see we've done it.",
    "",
    " ",
    "\n",
    "a" * 300,
]

TINY_TOKENIZER = build_tiny_model().tokenizer

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi 😀"}],
    [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
     {"role": "user", "content": "and  3+3?\n"}],
]


@pytest.fixture(scope="module")
def transformers_gguf_tokenizer():
    transformers = pytest.importorskip("transformers")
    path = packaged_gguf_path()
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.mark.real_model
def test_real_tokenizer_matches_transformers_gguf_tokenizer(smollm2, transformers_gguf_tokenizer):
    ours, theirs = smollm2.tokenizer, transformers_gguf_tokenizer
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == theirs.encode(text, add_special_tokens=False), text
        assert ours.encode(text, add_special_tokens=True) == theirs.encode(text), text
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)
    assert ours.eos_token_ids == (theirs.eos_token_id,) and ours.bos_token_id == theirs.bos_token_id == 1
    assert ours.vocab_size == len(theirs) == smollm2.config.vocab_size


@pytest.mark.real_model
def test_real_chat_template_matches_transformers(smollm2, transformers_gguf_tokenizer):
    for messages in CONVERSATIONS:
        for add_generation_prompt in (True, False):
            expected = transformers_gguf_tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add_generation_prompt)
            assert smollm2.tokenizer.apply_chat_template(
                messages, add_generation_prompt=add_generation_prompt) == expected


def _stream(tokenizer, ids, skip_special_tokens=True):
    detok = tokenizer.new_detokenizer(skip_special_tokens=skip_special_tokens)
    pieces = [detok.push(i) for i in ids]
    return pieces, detok.flush()


@pytest.mark.real_model
def test_real_detokenizer_concatenates_to_decode(smollm2):
    tok = smollm2.tokenizer
    for text in TEXTS:
        ids = tok.encode(text)
        for skip in (True, False):
            pieces, tail = _stream(tok, ids, skip)
            assert "".join(pieces) + tail == tok.decode(ids, skip_special_tokens=skip), text
            assert tail == "" and not any("\ufffd" in p for p in pieces)


@pytest.mark.real_model
def test_real_detokenizer_on_random_ids_including_broken_utf8(smollm2):
    tok, rng = smollm2.tokenizer, random.Random(0)
    byte_tokens = [tok.token_to_id(c) for c in "ðŁĺĢâĤ¬"]  # lead/continuation bytes of multi-byte chars
    for _ in range(30):
        ids = [rng.choice(byte_tokens) if rng.random() < 0.5 else rng.randrange(tok.vocab_size)
               for _ in range(rng.randrange(1, 40))]
        pieces, tail = _stream(tok, ids)
        assert "".join(pieces) + tail == tok.decode(ids)


def test_detokenizer_holds_back_half_a_character():
    tok = build_tiny_model().tokenizer
    smile = tok.encode("😀")  # four byte-level tokens, one per UTF-8 byte, in the tiny vocabulary
    assert len(smile) > 1
    detok = tok.new_detokenizer()
    assert "".join(detok.push(i) for i in tok.encode("hi ")) == "hi "
    assert [detok.push(i) for i in smile[:-1]] == [""] * (len(smile) - 1)
    assert detok.push(smile[-1]) == "😀"
    assert detok.push(smile[0]) == ""
    assert detok.flush() == "\ufffd"  # never completed: shown as decode shows it


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=511), max_size=30))
def test_tiny_detokenizer_equals_decode_for_any_ids(ids):
    tok = TINY_TOKENIZER
    pieces, tail = _stream(tok, ids)
    assert "".join(pieces) + tail == tok.decode(ids)

