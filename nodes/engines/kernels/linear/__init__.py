"""The linear layers of decode steps (a few token rows against the weights), by CPU: `amx` (AMX
tiles) and `dot_bf16` (AVX512-BF16's vdpbf16ps outer products) in bf16, `dot_f32` (AVX-512 FMA
outer products) in float32. kernels.dispatch picks one and the rows it serves; other steps, and
CPUs without those features, stay on torch's oneDNN / MKL GEMMs.
"""
