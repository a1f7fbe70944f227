"""float32 linear layers for decode steps (1-32 rows) as outer products on AVX-512 FMAs, over weights
packed by blocks of 64 outputs; a drop-in for `F.linear` on those steps.

Contract: `AVAILABLE` is linear.dot_bf16.AVAILABLE (`kernels.cpu.probe().avx512bf16`: numba and a
CPU with AVX512-BF16, which has AVX-512F; the float32 kernel shares their code). `pack(w)` turns a
float32 matrix [outputs, inputs] into [ceil(outputs / 64), inputs, 64] (for each block and input,
the block's 64 weights; outputs past the matrix's are zero). `linear(x, w, out)`: out = x @ W.T for
float32 numpy arrays x [rows, inputs] and out [rows, outputs], w packed. `SmallLinear(weights)`
packs the given torch weights once (into one huge-page arena, each matrix 64-byte aligned) and is
called as `F.linear(x, weight)` is: steps of at most `MAX_ROWS` rows of a known weight run here,
everything else (prefills, unknown weights) on `F.linear`. Each output is one FMA chain over the
inputs in order, whatever the number of rows: a row's result does not depend on the rows beside
it. Results differ from MKL's by float32 summation order. `warmup()` compiles the kernel (raises
where it cannot be built).

Why: a decode step is bound by reading the weights, and MKL's float32 GEMVs and small GEMMs read
them well below the memory bandwidth. Here the weights of a step stream once for up to 6 rows (four
vectors of 16 outputs x 6 rows = 24 accumulators in registers), and from cache for more, with the
next weights requested meanwhile (linear.dot_bf16 describes the loop). docs/KERNELS.md has the
measured gain over compiled torch (`make bench-engine`).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from nodes.engines import hugepages
from nodes.engines.kernels.linear import dot_bf16

AVAILABLE = dot_bf16.AVAILABLE
BLOCK_OUTPUTS = dot_bf16.BLOCK_OUTPUTS
MAX_ROWS = 32   # decode steps; prefills keep MKL's GEMMs


def pack(w: np.ndarray) -> np.ndarray:
    """[outputs, inputs] float32 -> [blocks, inputs, 64] (zero outputs past the matrix's)."""
    outputs, inputs = w.shape
    padded = np.zeros((dot_bf16.padded_outputs(outputs), inputs), np.float32)
    padded[:outputs] = w
    return np.ascontiguousarray(padded.reshape(-1, BLOCK_OUTPUTS, inputs).transpose(0, 2, 1))


if AVAILABLE:
    import numba

    from nodes.engines.kernels.linear.dot_bf16 import _block_sums

    @numba.njit(cache=True, boundscheck=False, nogil=True)
    def linear(x, w, out):  # pragma: no cover - runs compiled
        sums = np.empty((x.shape[0], BLOCK_OUTPUTS), np.float32)
        n = out.shape[1]
        for b in range(w.shape[0]):
            _block_sums(x, w, b, sums, False)
            for m in range(out.shape[0]):
                for j in range(min(BLOCK_OUTPUTS, n - b * BLOCK_OUTPUTS)):
                    out[m, b * BLOCK_OUTPUTS + j] = sums[m, j]


def warmup() -> None:
    if not AVAILABLE:
        raise RuntimeError("the CPU has no AVX512-BF16 (or numba is missing)")
    w = pack(np.ones((3, 4), np.float32))
    for rows in (1, 7):
        out = np.zeros((rows, 3), np.float32)
        linear(np.ones((rows, 4), np.float32), w, out)
        assert np.all(out == 4.0)


class SmallLinear:
    """`F.linear` for the given weights, on `linear` for steps of at most MAX_ROWS rows."""

    def __init__(self, weights: list[torch.Tensor]) -> None:
        # One huge-page arena, each matrix 64-byte aligned: numpy's buffers start anywhere on a
        # 16-byte boundary, and there every 64-byte load of weights splits across two cache lines.
        arena = hugepages.Arena([(dot_bf16.padded_outputs(w.shape[0]) * w.shape[1],) for w in weights], torch.float32)
        # Keyed by identity: the runner keeps each weight for its lifetime and passes that tensor.
        self._packed = {id(w): (w, arena.copy(torch.from_numpy(pack(w.detach().contiguous().numpy()))).numpy())
                        for w in weights}

    def __call__(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        entry = self._packed.get(id(weight))
        if entry is None or entry[0] is not weight or x.dim() != 2 or x.shape[0] > MAX_ROWS:
            return F.linear(x, weight)
        out = torch.empty(x.shape[0], weight.shape[0], dtype=torch.float32)
        linear(x.contiguous().numpy(), entry[1], out.numpy())
        return out

    @property
    def num_bytes(self) -> int:
        return sum(packed.nbytes for _, packed in self._packed.values())
