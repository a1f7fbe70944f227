"""The gateway reads the tokenizer and context length without torch: a gateway process carries
no tensor library (hundreds of MiB and seconds of start-up it does not use)."""

from __future__ import annotations

import subprocess
import sys

from nodes.engines.model_loader import TINY_MAX_POSITIONS, build_tiny_model
from nodes.gateway.backend import load_model_info


def test_the_tiny_models_info_matches_the_model_the_nodes_build():
    info, model = load_model_info("tiny"), build_tiny_model()
    text = "hello tiny world"
    assert info.tokenizer.encode(text) == model.tokenizer.encode(text)
    assert info.max_model_len == model.config.max_position_embeddings == TINY_MAX_POSITIONS


def test_loading_the_model_info_never_imports_torch():
    code = ("import sys; from nodes.gateway.backend import load_model_info; import nodes.gateway.app; "
            "load_model_info('tiny'); print('torch' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "False"


def test_a_random_shape_s_info_matches_its_model_without_torch():
    from nodes.engines.random_model import random_config, random_tokenizer

    info = load_model_info("random-llama-8b:2")
    assert info.max_model_len == random_config("random-llama-8b").max_position_embeddings == 32768
    assert info.tokenizer.encode("hello world") == random_tokenizer().encode("hello world")
    code = ("import sys; from nodes.gateway.backend import load_model_info; "
            "load_model_info('random-llama-8b'); print('torch' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "False"
