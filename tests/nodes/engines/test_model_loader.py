"""load_model / prepare_model: the GGUF -> HF folder cache, HF folders, and the packaged default."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from nodes.engines import model_loader
from nodes.engines.hf_folder import save_folder
from nodes.engines.model_loader import DEFAULT_MODEL, SOURCE_MARKER, load_model, prepare_model

HF_FILES = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json", "special_tokens_map.json", SOURCE_MARKER}


def _same_weights(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_gguf_is_converted_once_into_a_hf_folder(tmp_path, tiny_gguf, tiny_model):
    cache = tmp_path / "models"
    model = load_model(str(tiny_gguf), model_dir=cache)
    folder = cache / "tiny-test"
    assert {p.name for p in folder.iterdir()} == HF_FILES
    assert model.name == "tiny-test" and model.source == str(tiny_gguf)
    assert model.config == tiny_model.config and _same_weights(model.weights, tiny_model.weights)
    written = (folder / "model.safetensors").stat().st_mtime_ns
    again = load_model(str(tiny_gguf), model_dir=cache)
    assert (folder / "model.safetensors").stat().st_mtime_ns == written  # loaded from the cache
    assert _same_weights(again.weights, model.weights)
    assert not [p for p in cache.iterdir() if ".tmp-" in p.name]  # no staging dir left behind


def test_a_changed_gguf_or_force_converts_again(tmp_path, tiny_gguf):
    cache = tmp_path / "models"
    folder = prepare_model(str(tiny_gguf), model_dir=cache)
    marker = json.loads((folder / SOURCE_MARKER).read_text())
    os.utime(tiny_gguf, ns=(1, 1))
    prepare_model(str(tiny_gguf), model_dir=cache)
    assert json.loads((folder / SOURCE_MARKER).read_text())["mtime_ns"] == 1 != marker["mtime_ns"]
    (folder / "config.json").write_text("{}")
    prepare_model(str(tiny_gguf), model_dir=cache, force=True)
    assert json.loads((folder / "config.json").read_text())["model_type"] == "llama"


def test_model_dir_defaults_to_env(monkeypatch, tmp_path, tiny_gguf):
    monkeypatch.setenv("PDBUS_MODEL_DIR", str(tmp_path / "env-models"))
    assert prepare_model(str(tiny_gguf)) == tmp_path / "env-models" / "tiny-test"


def test_hf_folder_loads_in_the_requested_dtype(tmp_path, tiny_model):
    save_folder(tmp_path, tiny_model.config, tiny_model.weights, tiny_model.tokenizer)
    model = load_model(str(tmp_path), dtype=torch.bfloat16)
    assert model.dtype == torch.bfloat16 and model.source == str(tmp_path) and model.name == tmp_path.name
    assert torch.equal(model.weights["model.norm.weight"], torch.ones(64, dtype=torch.bfloat16))


def test_hf_folder_extras_are_ignored_and_generation_config_sets_eos(tmp_path, tiny_model):
    weights = dict(tiny_model.weights, **{"lm_head.weight": tiny_model.weights["model.embed_tokens.weight"].clone(),
                                          "model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(8)})
    save_folder(tmp_path, tiny_model.config, weights, tiny_model.tokenizer)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    model = load_model(str(tmp_path))
    assert model.weights.keys() == tiny_model.weights.keys()
    assert model.config.eos_token_ids == (2, 0) and model.tokenizer.eos_token_ids == (2, 0)


def test_untied_model_keeps_lm_head(tmp_path, tiny_model):
    config = tiny_model.config.__class__(**{**_fields(tiny_model.config), "tie_word_embeddings": False})
    weights = dict(tiny_model.weights, **{"lm_head.weight": torch.randn(512, 64)})
    save_folder(tmp_path, config, weights, tiny_model.tokenizer)
    model = load_model(str(tmp_path))
    assert torch.equal(model.weights["lm_head.weight"], weights["lm_head.weight"])


def _fields(config) -> dict:
    return {name: getattr(config, name) for name in config.__slots__}


def test_saved_folder_loads_in_transformers(tmp_path, tiny_model):
    transformers = pytest.importorskip("transformers")
    save_folder(tmp_path, tiny_model.config, tiny_model.weights, tiny_model.tokenizer)
    reference = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32)
    state = reference.state_dict()
    assert all(torch.equal(state[k], v) for k, v in tiny_model.weights.items())
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert hf_tokenizer.encode("Hello 😀 <|im_end|>") == tiny_model.tokenizer.encode("Hello 😀 <|im_end|>")
    messages = [{"role": "user", "content": "hi"}]
    assert hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == \
        tiny_model.tokenizer.apply_chat_template(messages)


def _fake_packaged_cache(tmp_path, tiny_model):
    folder = tmp_path / DEFAULT_MODEL
    folder.mkdir()
    save_folder(folder, tiny_model.config, tiny_model.weights, tiny_model.tokenizer)
    (folder / SOURCE_MARKER).write_text("{}")
    return folder


def test_packaged_cache_still_loads_when_the_package_is_gone(monkeypatch, tmp_path, tiny_model):
    _fake_packaged_cache(tmp_path, tiny_model)
    monkeypatch.setattr(model_loader.importlib.util, "find_spec", lambda name: None)
    model = load_model(model_dir=tmp_path)
    assert model.name == DEFAULT_MODEL and model.source == "packaged"
    assert _same_weights(model.weights, tiny_model.weights)


@pytest.mark.real_model
def test_packaged_model_is_cached_under_the_default_dir(smollm2):
    folder = model_loader.default_model_dir() / DEFAULT_MODEL
    assert {p.name for p in folder.iterdir()} >= HF_FILES
    assert smollm2.source == "packaged" and smollm2.config.vocab_size == 49152
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_key_value_heads"] == 3
    assert json.loads((folder / "tokenizer_config.json").read_text())["chat_template"].startswith("{% for")


def test_concurrent_prepares_convert_once(tmp_path, tiny_gguf, monkeypatch):
    """Nodes starting together share one conversion (file lock), and all get a complete folder."""
    from nodes.engines import gguf_reader

    calls = []
    real_read = gguf_reader.read_gguf
    monkeypatch.setattr(gguf_reader, "read_gguf", lambda *a, **k: calls.append(1) or real_read(*a, **k))
    with ThreadPoolExecutor(4) as pool:
        folders = list(pool.map(lambda _: prepare_model(str(tiny_gguf), model_dir=tmp_path), range(4)))
    assert len(set(folders)) == 1 and len(calls) == 1
    assert load_model(str(folders[0])).config.num_layers == 2
