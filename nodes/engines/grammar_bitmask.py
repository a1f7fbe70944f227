"""Token bitmasks: allocate them, and set the logits they forbid to -inf, in place, on CPU or GPU.

Contract: a bitmask is an int32 tensor [rows, ceil(vocab / 32)] on the CPU; bit j of word w of a
row (little-endian) allows token 32 * w + j, the layout xgrammar and llguidance both fill.
- `allocate_bitmask(rows, vocab_size)`: every token allowed (-1 words).
- `apply_bitmask(logits, bitmask, rows)`: for each i, the logits of row `rows[i]` whose bit in
  `bitmask[i]` is 0 become -inf; other rows are untouched. Columns past 32 * words (a vocabulary
  wider than the mask) are forbidden too. float32, bfloat16 and float16 logits, any device.
- `unpack_bitmask(bitmask, vocab_size)`: bool numpy [rows, vocab_size]; `allowed_tokens(bitmask_row,
  vocab_size)`: the allowed ids of one row (tests, debugging).

Why not a library's kernel: xgrammar's CPU kernel costs grow with the forbidden tokens (about
0.3 ms per 49,152-token row that allows only a few, as most steps of a JSON grammar do: after `{`
only `"` or `}`), and llguidance's torch helper needs torch.compile. Here the cost follows the
smaller side of each row: a row that allows few tokens is filled with -inf and its allowed logits
put back; a row that allows most has only its forbidden ones written. On 32 rows of masks met in
JSON documents: 1.2-1.6 ms against xgrammar's 2.7-6.7 ms (harness/bench/grammar_mask.py,
`apply_us`). On a GPU the bool mask is copied over and applied with one masked_fill.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

NEG_INF = float("-inf")


def allocate_bitmask(rows: int, vocab_size: int) -> torch.Tensor:
    return torch.full((rows, (vocab_size + 31) // 32), -1, dtype=torch.int32)


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> np.ndarray:
    """bool [rows, vocab_size]: which tokens each row allows (padding past the mask's words: False)."""
    words = np.ascontiguousarray(bitmask.cpu().numpy()).view(np.uint8)
    bits = np.unpackbits(words, axis=-1, bitorder="little").view(np.bool_)
    if bits.shape[1] >= vocab_size:
        return bits[:, :vocab_size]
    padded = np.zeros((bits.shape[0], vocab_size), dtype=np.bool_)
    padded[:, :bits.shape[1]] = bits
    return padded


def allowed_tokens(bitmask_row: torch.Tensor, vocab_size: int) -> list[int]:
    return np.flatnonzero(unpack_bitmask(bitmask_row.reshape(1, -1), vocab_size)[0]).tolist()


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: Sequence[int]) -> None:
    if not rows:
        return
    if len(rows) != bitmask.shape[0]:
        raise ValueError(f"{bitmask.shape[0]} bitmask rows for {len(rows)} logits rows")
    vocab = logits.shape[-1]
    allowed = unpack_bitmask(bitmask, vocab)
    if logits.device.type != "cpu":  # one elementwise kernel on the device beats index lists
        index = torch.tensor(list(rows), device=logits.device)
        forbidden = torch.from_numpy(~allowed).to(logits.device, non_blocking=True)
        logits[index] = logits[index].masked_fill(forbidden, NEG_INF)
        return
    target = logits if logits.is_contiguous() else logits.contiguous()
    row_ids = np.asarray(rows, dtype=np.int64)
    sparse = np.count_nonzero(allowed, axis=1) * 2 < vocab
    if sparse.any():
        _keep_only(target, row_ids[sparse], allowed[sparse])
    if (~sparse).any():
        _forbid(target, row_ids[~sparse], ~allowed[~sparse])
    if target is not logits:
        logits.copy_(target)


def _flat_indices(row_ids: np.ndarray, cells: np.ndarray, vocab: int, device: torch.device) -> torch.Tensor:
    """Indices into logits.view(-1) of the True cells of a [len(row_ids), vocab] selection."""
    flat = np.flatnonzero(cells)
    return torch.from_numpy(row_ids[flat // vocab] * vocab + flat % vocab).to(device)


def _keep_only(logits: torch.Tensor, row_ids: np.ndarray, allowed: np.ndarray) -> None:
    flat = logits.view(-1)
    keep = _flat_indices(row_ids, allowed, logits.shape[-1], logits.device)
    values = flat.index_select(0, keep)
    logits.index_fill_(0, torch.from_numpy(row_ids).to(logits.device), NEG_INF)
    flat.index_copy_(0, keep, values)


def _forbid(logits: torch.Tensor, row_ids: np.ndarray, forbidden: np.ndarray) -> None:
    flat = logits.view(-1)
    flat.index_fill_(0, _flat_indices(row_ids, forbidden, logits.shape[-1], logits.device), NEG_INF)
