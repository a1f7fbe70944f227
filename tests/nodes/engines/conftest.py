"""Shared engine fixtures: the tiny random model and the real SmolLM2 model.

`tiny_model` is rebuilt per test (milliseconds). `smollm2` is session-scoped and loads the real model
through the loader's cache in `model_dir` ($PDBUS_MODEL_DIR or <repo>/.models), so the one-time GGUF
conversion (~15 s) happens at most once per machine, and the cached load (~1 s) once per session.
Tests that use `smollm2` should carry `@pytest.mark.real_model`.
"""

from __future__ import annotations

import pytest
import torch

from nodes.engines.model_loader import LoadedModel, build_tiny_model, load_model


@pytest.fixture
def tiny_model() -> LoadedModel:
    return build_tiny_model(seed=0, dtype=torch.float32)


@pytest.fixture(scope="session")
def smollm2() -> LoadedModel:
    return load_model("SmolLM2-135M-Instruct", dtype=torch.float32)
