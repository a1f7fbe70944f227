"""A prefill span's causal attention over its cache on tiles: `tiled`, on AMX (kernels.amx_tiles)
or on its AVX512-BF16 emulation (kernels.soft_tiles). torch's path: SDPA."""
