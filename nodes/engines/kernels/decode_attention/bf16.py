"""numba decode attention for bf16 slot caches: RoPE, KV write and GQA softmax attention in one pass.

Contract (only where `AVAILABLE`: `kernels.cpu.probe().numba`; numpy arrays, bf16 values as uint16
bit patterns): `decode_attention(qkv, cos, sin, positions, slots, cache, layer, num_heads, out, pairs,
pair_values, prefetch)` takes one decode token per row of `qkv` [rows, (heads + 2 kv_heads) * head_dim]
(any number of rows): RoPE on its q and k (rotate-half tables, rotate-half's sign in `sin`, rounded as
llama_ops.apply_rope: round(round(x * cos) + swapped * sin)), its k and v written into `cache` [layers,
slots, 2, kv_heads, capacity, head_dim] at its position (in place), and softmax attention of its q
heads over keys 0..position of its slot, written to `out` [rows, heads * head_dim]. No mask: each row
reads exactly its own keys. `pairs` picks the vdpbf16ps blocks where `PAIRS`, for the values too if
`pair_values` (callers pass `PAIR_VALUES`); `prefetch` requests each K and V stream's lines a block
ahead and changes no result. `warmup()` compiles it; `prefetch_pays()` says whether to prefetch on
this machine; kernels.dispatch decides whether it serves.
Numerics: scores, softmax and weighted sum in float32, the output scaled by 1 / sum and rounded to
bf16 once; with pairs, q (and, with `pair_values`, the weights, as SDPA rounds them) rounded to bf16.
The exp is bf16_scalar's `_exp_nonpositive` (within 3e-7 relative of float64 exp; it vectorises,
numba's np.exp is a libm call per score); scores NEGLIGIBLE_GAP below a row's maximum weigh 0. So
results differ from SDPA's by summation order and the exp's error.

Why: the query heads sharing a KV head go through its keys and values together, so each K and V row
is read once per step, not once per head, with nothing gathered, masked or padded. The kernel is
bound by reading the cache: for SmolLM2's shape it runs 16 keys at a time on decode_attention.blocks'
vector code; two (row, KV head) units interleave (unit u's keys scored while unit u - 1's values are
weighted), so two streams keep more reads in flight; software prefetching, which pays on some CPUs
and costs on others, is timed once a process. AMX tiles do not help: their K and V loads straight
from this cache are slower than vector loads once it is out of L2.
"""

from __future__ import annotations

import functools
import os
import time

import numpy as np

from nodes.engines.kernels.cpu import probe
from nodes.engines.kernels.decode_attention.blocks import PAIRS
from nodes.engines.kernels.jit import NUMBA as AVAILABLE

# Scores are finite (no mask, no padding), so the NaN/inf assumptions are safe and let the max and
# sum reductions vectorise.
FASTMATH = {"reassoc", "contract", "nnan", "ninf", "nsz", "arcp"}
# The GQA shape the 16-key block kernels are built for (SmolLM2: 9 heads over 3 KV heads of 64);
# other shapes take the one-key-at-a-time loops.
BLOCK_GROUP, BLOCK_HEAD_DIM = 3, 64
LOWEST = np.float32(-3.0e38)   # a finite "minus infinity": the kernel is compiled assuming no inf
# Scores this far below a row's maximum get weight 0, not exp(gap) (below 1.6e-28, which no float32
# sum of weights, all beside the maximum's 1, can register): weights near float32's smallest normal
# times the values give denormal products, and each FMA on a denormal takes a microcode assist,
# which slows the kernel severalfold on widely spread scores. The bf16 pair products treat
# denormals as zero themselves.
NEGLIGIBLE_GAP = np.float32(-64.0)


def _pair_values() -> bool:
    """Whether the value side multiplies bf16 pairs too, where the key side does: not on CPUs with
    AMX. Xeons with AMX issue two 512-bit FMAs a cycle but one vdpbf16ps, so float32 FMAs on widened
    values are faster there; elsewhere (AVX512-BF16 without AMX) float32 FMAs are the bound, so pairs
    stay. A CPU feature (`probe().host_amx`, masks ignored), not a timing: the choice changes the
    rounding (pairs round the weights to bf16, as SDPA does), and it must not differ between two
    processes on one machine."""
    return PAIRS and not probe().host_amx


PAIR_VALUES = _pair_values()

if AVAILABLE:
    import numba

    from nodes.engines.kernels.bf16_scalar import (
        _bf16_bits,
        _exp_nonpositive,
        _prefetch,
        _rope_pair,
        _round,
        _to_f32,
    )
    from nodes.engines.kernels.decode_attention import blocks as vector_blocks

    _qk_block = vector_blocks.make_qk_block(BLOCK_GROUP, BLOCK_HEAD_DIM)
    _pv_block = vector_blocks.make_pv_block(BLOCK_GROUP, BLOCK_HEAD_DIM)
    BLOCK = vector_blocks.BLOCK
    _prefetch_block = vector_blocks.make_prefetch_block(BLOCK_HEAD_DIM)
    # numba prunes `if PAIRS and ...` where PAIRS is False, so these are never compiled without AVX512-BF16.
    _qk_pairs = vector_blocks.make_qk_block(BLOCK_GROUP, BLOCK_HEAD_DIM, pairs=True) if PAIRS else None
    _pv_pairs = vector_blocks.make_pv_block(BLOCK_GROUP, BLOCK_HEAD_DIM, pairs=True) if PAIRS else None

    @numba.njit(inline="always", fastmath=FASTMATH)
    def _rope_and_write(qkv, m, cos, sin, pos, slot, cache, layer, num_heads, q):  # pragma: no cover
        num_kv_heads, head_dim = cache.shape[3], cache.shape[5]
        half = head_dim // 2
        for h in range(num_heads + num_kv_heads):
            for d in range(half):
                low, high = _rope_pair(qkv, m, h * head_dim, d, half, cos, sin, pos)
                q[h, d], q[h, d + half] = _round(low), _round(high)
        v_base = (num_heads + num_kv_heads) * head_dim
        for g in range(num_kv_heads):
            for d in range(head_dim):
                cache[layer, slot, 0, g, pos, d] = _bf16_bits(q[num_heads + g, d])
                cache[layer, slot, 1, g, pos, d] = qkv[m, v_base + g * head_dim + d]

    @numba.njit(inline="always", fastmath=FASTMATH)
    def _scores(q, first, group, keys, start, num_keys, scale, scores):  # pragma: no cover - runs compiled
        """scores[i, j] = q[first + i] . keys[j] * scale for keys start..num_keys - 1, one at a time
        (the block kernel's remainder, and every key of shapes it is not built for)."""
        head_dim = keys.shape[1]
        for j in range(start, num_keys):
            for i in range(group):
                dot = np.float32(0.0)
                for d in range(head_dim):
                    dot += q[first + i, d] * _to_f32(keys[j, d])
                scores[i, j] = dot * scale

    @numba.njit(inline="always", fastmath=FASTMATH)
    def _softmax(scores, tops, group, block_end, num_keys, inverse):  # pragma: no cover - runs compiled
        """scores[i, :num_keys] -> exp(score - max), inverse[i] = 1 / their sum. The maximum of keys
        below block_end is already in tops[i] (the block kernel's lanes); numba's own max loop does
        not vectorise and would cost more than the exp."""
        for i in range(group):
            top = tops[i, 0]
            for lane in range(tops.shape[1]):
                top = max(top, tops[i, lane])
            for j in range(block_end, num_keys):
                top = max(top, scores[i, j])
            total = np.float32(0.0)
            for j in range(num_keys):
                gap = scores[i, j] - top
                weight = _exp_nonpositive(gap) if gap > NEGLIGIBLE_GAP else np.float32(0.0)
                scores[i, j] = weight
                total += weight
            inverse[i] = np.float32(1.0) / total

    @numba.njit(inline="always", fastmath=FASTMATH)
    def _weighted_values(weights, group, values, start, num_keys, acc):  # pragma: no cover - runs compiled
        """acc[i] += weights[i, j] * values[j] for j in start..num_keys - 1, one value row at a time."""
        head_dim = values.shape[1]
        for j in range(start, num_keys):
            for i in range(group):
                weight = weights[i, j]
                for d in range(head_dim):
                    acc[i, d] += weight * _to_f32(values[j, d])

    @numba.njit(inline="always")
    def _prefetch_rows(rows, start, num_rows, next_rows):  # pragma: no cover - runs compiled
        """Request rows start..start + BLOCK - 1 of a K or V stream of num_rows rows; those past its
        end continue at the start of the stream read next (`next_rows`)."""
        for r in range(start, start + BLOCK):
            stream, row = (rows, r) if r < num_rows else (next_rows, r - num_rows)
            if row < stream.shape[0]:
                for c in range(0, stream.shape[1], 32):   # a 64-byte line holds 32 bf16 values
                    _prefetch(stream, row, c)

    @numba.njit(inline="always")
    def _prefetch_stream(rows, start, num_rows, next_rows):  # pragma: no cover - runs compiled
        """`_prefetch_rows`, as 32 plain line requests where the block lies inside its stream (all
        but a unit's last block or two): the row-by-row loop's index arithmetic on every block is a
        measurable share of a unit."""
        if start + BLOCK <= num_rows:
            _prefetch_block(rows, start)
        else:
            _prefetch_rows(rows, start, num_rows, next_rows)

    @numba.njit(cache=True, boundscheck=False, nogil=True, fastmath=FASTMATH)
    def decode_attention(qkv, cos, sin, positions, slots, cache, layer, num_heads, out, pairs, pair_values,  # pragma: no cover
                         prefetch):
        rows, num_kv_heads, head_dim = qkv.shape[0], cache.shape[3], cache.shape[5]
        group = num_heads // num_kv_heads
        blocks = group == BLOCK_GROUP and head_dim == BLOCK_HEAD_DIM
        pairs = PAIRS and pairs and blocks
        scale = np.float32(1.0 / np.sqrt(head_dim))
        max_keys = 1
        for m in range(rows):
            max_keys = max(max_keys, positions[m] + 1)
        q = np.empty((rows, num_heads + num_kv_heads, head_dim), np.float32)
        for m in range(rows):
            _rope_and_write(qkv, m, cos, sin, positions[m], slots[m], cache, layer, num_heads, q[m])
        qb = np.empty((rows, num_heads, head_dim), np.uint16)   # the rounded q heads as bf16 bits, for pairs
        if PAIRS and pairs:
            for m in range(rows):
                for h in range(num_heads):
                    for d in range(head_dim):
                        qb[m, h, d] = _bf16_bits(q[m, h, d])
        # Two of each: unit u's scores are computed while unit u - 1's values are weighted.
        scores = np.empty((2, group, max_keys), np.float32)
        tops = np.empty((2, group, vector_blocks.LANES), np.float32)
        inverse = np.empty((2, group), np.float32)
        acc = np.empty((group, head_dim), np.float32)
        units = rows * num_kv_heads   # unit u: row u // num_kv_heads, KV head u % num_kv_heads
        for u in range(units + 1):
            now, before = u % 2, (u + 1) % 2
            m, g = min(u, units - 1) // num_kv_heads, min(u, units - 1) % num_kv_heads
            pm, pg = max(u - 1, 0) // num_kv_heads, max(u - 1, 0) % num_kv_heads
            keys, values = cache[layer, slots[m], 0, g], cache[layer, slots[pm], 1, pg]
            num_keys = positions[m] + 1 if u < units else 0
            num_values = positions[pm] + 1 if u > 0 else 0
            key_blocks = num_keys // BLOCK if blocks else 0
            value_blocks = num_values // BLOCK if blocks else 0
            tops[now] = LOWEST
            acc[:, :] = 0.0
            following = min(u + 1, units - 1)   # the unit whose keys are read next; its values follow these keys
            next_keys = cache[layer, slots[following // num_kv_heads], 0, following % num_kv_heads]
            next_values = cache[layer, slots[m], 1, g]
            # Views taken once a unit: numba counts a reference for each view it makes, an atomic
            # call (behind a vzeroupper) that would be made for every block if taken in the loop.
            q_bits, q_floats, now_scores, now_tops, weights = qb[m], q[m], scores[now], tops[now], scores[before]
            first = g * group
            for b in range(max(key_blocks, value_blocks)):   # the K and V streams side by side
                if prefetch:
                    ahead = (b + 1) * BLOCK
                    _prefetch_stream(keys, ahead, num_keys, next_keys)
                    _prefetch_stream(values, ahead, num_values, next_values)
                if PAIRS and pairs:
                    if b < key_blocks:
                        _qk_pairs(q_bits, first, keys, b * BLOCK, scale, now_scores, now_tops)
                    if b < value_blocks:
                        if pair_values:
                            _pv_pairs(weights, values, b * BLOCK, acc)
                        else:
                            _pv_block(weights, values, b * BLOCK, acc)
                else:
                    if b < key_blocks:
                        _qk_block(q_floats, first, keys, b * BLOCK, scale, now_scores, now_tops)
                    if b < value_blocks:
                        _pv_block(weights, values, b * BLOCK, acc)
            if u > 0:
                _weighted_values(scores[before], group, values, value_blocks * BLOCK, num_values, acc)
                for i in range(group):
                    for d in range(head_dim):
                        out[pm, (pg * group + i) * head_dim + d] = _bf16_bits(acc[i, d] * inverse[before, i])
            if u < units:
                _scores(q[m], g * group, group, keys, key_blocks * BLOCK, num_keys, scale, scores[now])
                _softmax(scores[now], tops[now], group, key_blocks * BLOCK, num_keys, inverse[now])


def warmup() -> None:
    """Compile (or load from the disk cache) the kernel for the array types the runner passes (the
    `pairs` flag is an argument, so one compilation serves both block kernels)."""
    heads, kv_heads, head_dim = 2, 1, 4
    qkv = np.zeros((1, (heads + 2 * kv_heads) * head_dim), np.uint16)
    table = np.zeros((4, head_dim), np.uint16)
    index = np.zeros(1, np.int64)
    cache = np.zeros((1, 1, 2, kv_heads, 4, head_dim), np.uint16)
    decode_attention(qkv, table, table, index, index, cache, 0, heads, np.zeros((1, heads * head_dim), np.uint16), PAIRS,
                     PAIR_VALUES, False)


@functools.cache
def prefetch_pays(num_bytes: int = 192 << 20, rounds: int = 5) -> bool:
    """Whether the kernel runs faster with `prefetch` on this machine (asked once a process): both
    ways in turn, `rounds` times, over a synthetic batch-of-16, 512-key cache of about `num_bytes`
    (bigger than common last-level caches, so every pass reads memory); yes when the median of the
    rounds' time ratios is below 1 (paired rounds, since a shared machine's speed drifts between
    them). Under a second, once. The requests change no result, only time.
    `PDBUS_ATTENTION_PREFETCH=1` (or 0) skips the timing and answers yes (or no)."""
    def attend_layers():
        heads, kv_heads, head_dim, rows, keys = BLOCK_GROUP * 3, 3, BLOCK_HEAD_DIM, 16, 512
        layers = max(1, num_bytes // (rows * 2 * kv_heads * keys * head_dim * 2))
        cache = np.full((layers, rows, 2, kv_heads, keys, head_dim), 0x3C00, np.uint16)   # bf16 1.0
        qkv = np.full((rows, (heads + 2 * kv_heads) * head_dim), 0x3C00, np.uint16)
        table = np.full((keys, head_dim), 0x3C00, np.uint16)
        positions, slots = np.full(rows, keys - 1, np.int64), np.arange(rows, dtype=np.int64)
        out = np.empty((rows, heads * head_dim), np.uint16)

        def run(prefetch: bool) -> None:
            for layer in range(layers):
                decode_attention(qkv, table, table, positions, slots, cache, layer, heads, out, PAIRS, PAIR_VALUES,
                                 prefetch)
        return run
    return timed_prefetch_pays(attend_layers, rounds)


def timed_prefetch_pays(make_run, rounds: int) -> bool:
    """The decode kernels' prefetch question (this kernel's and decode_attention.f32's): forced by
    `PDBUS_ATTENTION_PREFETCH`, else `make_run()` builds the data and returns `run(prefetch)`,
    timed both ways in turn; yes when the median of the paired ratios is below 1."""
    forced = os.environ.get("PDBUS_ATTENTION_PREFETCH", "")
    if forced in ("0", "1"):
        return forced == "1"
    run = make_run()

    def seconds(prefetch: bool) -> float:
        start = time.perf_counter()
        run(prefetch)
        return time.perf_counter() - start

    seconds(False)   # faults the pages in and pushes the fill out of the caches
    ratios = [seconds(True) / seconds(False) for _ in range(rounds)]
    return float(np.median(ratios)) < 1.0
