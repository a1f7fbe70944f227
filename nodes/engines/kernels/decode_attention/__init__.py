"""Pure decode steps' attention in one pass: RoPE (bf16), the KV write into the slot cache and GQA
softmax attention over every cached key. `bf16` and `f32` are the kernels; `blocks` is the bf16
kernel's hand-built 16-key vector blocks. torch's path: apply_rope, an index write and SDPA."""
