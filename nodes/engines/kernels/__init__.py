"""Compiled CPU kernels: the only package that imports numba or llvmlite.

One subpackage per operation, each with a torch path that serves where its kernel does not:

    operation          modules                                   torch path it replaces
    linear             linear/dot_bf16, linear/amx,              F.linear / oneDNN's packed GEMMs
                       linear/dot_f32                            (decode steps of few rows)
    decode_attention   decode_attention/bf16, /f32 (+ /blocks)   RoPE + KV write + SDPA
    prefill_attention  prefill_attention/tiled (on amx_tiles     SDPA (causal, flash)
                       or soft_tiles)
    norm_rope          norm_rope/bf16 (+ /rows)                  rms_norm, apply_rope, KV writes
    kv_int8            kv_int8/encode, /decode (+ /vectors)      compiled torch (nodes.engines.kv_quant);
                                                                 bus/kv's numpy reference

Shared below them: `cpu` (the one CPU feature probe), `jit` (numba's options and a disk cache
keyed by these sources), `bf16_scalar` (bf16 arithmetic rounded as torch rounds), `llvm_bits`,
`llvm_vectors`, `llvm_rows` (hand-built LLVM vector code), `amx_tiles` and `soft_tiles` (AMX tile
operations, and their AVX512-BF16 emulation). `dispatch.plan(dtype, device)` is the one place
that decides which implementation serves each operation; `fast_path.Bf16FastPath` runs the bf16
decode step on the plan's kernels. docs/KERNELS.md has the table with each kernel's CPU feature,
fallback, test and measured gain over compiled torch (`make bench-engine`).

Importing this package imports nothing heavy; `cpu.onednn_bf16()` loads neither numba nor
llvmlite (vLLM's start-up fails in a process that has loaded llvmlite).
"""
