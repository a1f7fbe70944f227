"""Inference engines: the only package in pdbus that imports torch (or vllm).

`base.py` states the engine contract that node processes program against; `model_loader.py`
turns a model spec (packaged GGUF, local HF folder, or the tiny random model) into weights, a
config and a tokenizer; `llama.py` is the built-in runner.
"""
