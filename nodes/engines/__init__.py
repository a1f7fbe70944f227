"""Inference engines: the only package in pdbus that imports torch (or vllm).

`base.py` states the engine contract that node processes program against (the values crossing it
are in `engine_types.py`, importable without torch); `model_loader.py`
turns a model spec (packaged GGUF, local HF folder, or the tiny random model) into weights, a
config and a tokenizer; `llama.py` is the built-in runner and `llama_engine.py` the engine around it.

Importing this package sets OMP_WAIT_POLICY=PASSIVE (unless the environment already sets it)
before torch loads OpenMP: with OpenMP's default spin-waiting, engine processes sharing cores with
anything else slowed down 2-10x in `make bench-engine`'s thread study, while PASSIVE cost nothing
measurable at one thread per engine (see docs/BENCHMARKS.md, "Engine").
"""

import os
import sys

if "torch" not in sys.modules:   # OpenMP reads it once, when torch's runtime loads
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
