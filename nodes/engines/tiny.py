"""Pieces of the tiny random model that unit tests run instead of the real one.

Contract: `tiny_tokenizer(vocab_size)` is a small byte-level BPE tokenizer (deterministic; its merges
are learned from the fixed `CORPUS` below) with SmolLM2's special tokens and ChatML template, so text
in / text out works and any id below `vocab_size` decodes. `random_llama_weights(config, seed, dtype)`
returns Hugging Face Llama weights drawn like HF's init (normal, std 0.02; norms = 1), the same for
the same seed. `build_tiny_model` in `model_loader` puts the two together.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from nodes.engines.model_config import LlamaConfig, weight_shapes
from nodes.engines.tokenizer import Tokenizer

if TYPE_CHECKING:   # imported where weights are drawn: the tokenizer alone needs no torch
    import torch

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
BOS_TOKEN_ID = 1
EOS_TOKEN_ID = 2
INIT_STD = 0.02

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Merges are learned from this text; any fixed English works, it only has to give enough pairs.
CORPUS = (
    "The quick brown fox jumps over the lazy dog. A prefill node turns a prompt into its key and value "
    "cache and the first token; a decode node receives that cache and streams the rest of the answer. "
    "Nodes talk over a message bus. The scheduler routes each session to a decode node by consistent "
    "hashing, and heartbeats tell the broker when a node has died so that its work can move elsewhere. "
    "Once upon a time there was a little model that wanted to write stories about the sea, the sky, "
    "mountains, rivers, cities and the people who live in them. It read books and learned words, "
    "numbers like 1, 2, 3, 42 and 2024, and code such as def main(): return 0 or for i in range(10). "
    "Hello world! How are you today? I am fine, thank you. What is the capital of France? Paris is. "
    "Water boils at one hundred degrees; ice melts at zero. Good morning, good evening, good night. "
)


def tiny_tokenizer(vocab_size: int) -> Tokenizer:
    backend = BackendTokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    backend.train_from_iterator([CORPUS] * 4, trainer=trainer)
    return Tokenizer(backend, bos_token_id=BOS_TOKEN_ID, eos_token_ids=(EOS_TOKEN_ID,),
                     chat_template=CHATML_TEMPLATE,
                     special_tokens={"bos_token": SPECIAL_TOKENS[BOS_TOKEN_ID],
                                     "eos_token": SPECIAL_TOKENS[EOS_TOKEN_ID],
                                     "unk_token": SPECIAL_TOKENS[0], "pad_token": SPECIAL_TOKENS[EOS_TOKEN_ID]})


def random_llama_weights(config: LlamaConfig, seed: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    import torch

    generator = torch.Generator().manual_seed(seed)
    weights = {}
    for name, shape in weight_shapes(config).items():
        if len(shape) == 1:  # RMSNorm scales start at one, as in HF
            tensor = torch.ones(shape)
        else:
            tensor = torch.empty(shape).normal_(0.0, INIT_STD, generator=generator)
        weights[name] = tensor.to(dtype)
    return weights
