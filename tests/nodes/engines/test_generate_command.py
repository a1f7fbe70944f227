"""`pdbus generate` streams text from the built-in engine (tiny model: fast) and fails cleanly."""

from __future__ import annotations

import pytest
import torch

from nodes.cli import main


def test_generate_streams_tokens_and_summarises(capsys):
    assert main(["generate", "--model", "tiny", "--prompt", "Hello world", "--max-tokens", "6",
                 "--ignore-eos", "--dtype", "float32"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() and "6 generated" in err and "finish: length" in err


def test_generate_is_reproducible_with_a_seed(capsys):
    args = ["generate", "--model", "tiny", "--prompt", "Once upon a time", "--max-tokens", "8", "--ignore-eos",
            "--temperature", "0.9", "--seed", "5", "--chat"]
    main(args)
    first = capsys.readouterr().out
    main(args)
    assert capsys.readouterr().out == first


def test_bad_settings_and_models_exit_2_with_one_line(capsys):
    assert main(["generate", "--model", "tiny", "--prompt", "x", "--temperature", "-1"]) == 2
    assert "temperature" in capsys.readouterr().err
    assert main(["generate", "--model", "/no/such/model", "--prompt", "x"]) == 2
    assert "unknown model" in capsys.readouterr().err


def test_a_device_this_torch_cannot_use_exits_2_with_one_line(capsys):
    assert main(["generate", "--model", "tiny", "--prompt", "x", "--device", "gpu"]) == 2
    assert capsys.readouterr().err.strip() == 'pdbus generate: unknown [engine] device \'gpu\': use "cpu", "cuda" or "cuda:N"'
    if not torch.cuda.is_available():
        assert main(["generate", "--model", "tiny", "--prompt", "x", "--device", "cuda"]) == 2
        assert "sees no CUDA GPU" in capsys.readouterr().err


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_device_flag_reaches_the_engine(device, capsys):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    assert main(["generate", "--model", "tiny", "--prompt", "Hi", "--max-tokens", "3", "--ignore-eos",
                 "--dtype", "float32", "--device", device]) == 0
    assert "3 generated" in capsys.readouterr().err
