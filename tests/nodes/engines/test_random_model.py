"""Random-weight models of real shapes (nodes/engines/random_model.py): Llama 3 8B's dimensions, KV
sizes and parameter count, the spec's errors, and (slow: 1.3 B values drawn) one layer of it at full
width through the engine, its KV leaving encoded on the device path as the wire's reference says."""

from __future__ import annotations

import pytest
import torch

from nodes.engines.base import PrefillRequest, SamplingParams
from nodes.engines.hf_folder import ModelLoadError
from nodes.engines.model_loader import load_model
from nodes.engines.random_model import (
    RANDOM_SOURCE,
    is_random_spec,
    num_parameters,
    random_config,
    random_max_len,
)
from tests.nodes.engines.engine_helpers import make_engine
from tests.nodes.engines.test_kv_export import assert_export_is_the_reference


def test_the_8b_shape_is_llama_3_8b():
    config = random_config("random-llama-8b")
    assert (config.num_layers, config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim,
            config.intermediate_size, config.vocab_size) == (32, 4096, 32, 8, 128, 14336, 128256)
    assert num_parameters(config) == 8_030_261_248
    kv_bytes_per_token = config.num_layers * 2 * config.num_kv_heads * config.head_dim * 2   # bf16
    assert kv_bytes_per_token * 4096 == 512 * 2**20   # the 512 MiB for a 4K prompt
    assert random_config("random-llama-8b:2").num_layers == 2 and random_max_len("random-llama-8b") == 32768


@pytest.mark.parametrize("spec", ["random-llama-8b:0", "random-llama-8b:x", "random-llama-8b:999"])
def test_a_bad_layer_count_is_a_clear_error(spec):
    assert is_random_spec(spec)
    with pytest.raises(ModelLoadError, match="layer count after ':' must be a whole number"):
        load_model(spec)


def test_an_unknown_shape_is_an_unknown_model():
    assert not is_random_spec("random-llama-9b")
    with pytest.raises(ModelLoadError, match="unknown model 'random-llama-9b'"):
        load_model("random-llama-9b")


@pytest.mark.slow
def test_one_full_width_layer_prefills_and_exports_8b_shaped_kv():
    model = load_model("random-llama-8b:1", dtype=torch.bfloat16)
    assert model.source == RANDOM_SOURCE and model.name == "random-llama-8b:1"
    engine = make_engine(model, dtype="bfloat16", kv_export="int8", prefix_cache_bytes=0)
    prompt = tuple(torch.randint(0, model.config.vocab_size, (40,), generator=torch.Generator().manual_seed(0)).tolist())
    result = engine.prefill([PrefillRequest("r", prompt, SamplingParams(temperature=0.0))])[0]
    assert result.kv.info.shape == (1, 2, 8, 40, 128)
    assert torch.isfinite(result.kv.kv.float()).all()
    assert_export_is_the_reference(result.kv, "int8")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is there: it would draw")
def test_a_device_torch_cannot_use_is_a_clear_model_error():
    with pytest.raises(ModelLoadError, match="cannot draw random-llama-8b:1 on cuda"):
        load_model("random-llama-8b:1", device="cuda")
