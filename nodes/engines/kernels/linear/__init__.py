"""The linear layers of decode steps (a few token rows against the weights), by CPU:
`amx` (AMX tiles), `dot_bf16` (AVX512-BF16's vdpbf16ps outer products), `gemv` (widening GEMVs,
any AVX-512 CPU with numba) in bf16, and `dot_f32` (AVX-512 FMA outer products) in float32.
kernels.dispatch picks one; larger steps stay on torch's oneDNN / MKL GEMMs."""
