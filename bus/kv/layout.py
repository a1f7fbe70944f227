"""KV layout, dtypes and chunk planning (pure, numpy only).

The engine's KV cache of one request is an array `layers x 2 (K, V) x kv_heads x tokens x head_dim`.
The codec views it as `planes x tokens x head_dim` where plane `p = (layer * 2 + kv) * kv_heads + head`:
one plane is one head's K (or V) for every token, contiguous in the engine's layout.

A chunk is a plane range x token range. Chunks take whole planes (whole layers when they fit,
so a chunk is one contiguous slice of the engine's memory: raw mode sends it without a copy and the
receiver writes one contiguous region); only when one plane alone exceeds the chunk size are tokens
split. `plan_chunks` is deterministic: sender and receiver derive the same plan from the header.
`chunk_bytes_for(info, mode, chunk_bytes)` is the chunk size a transfer in `mode` plans with (quantized
chunks are sized by values: its docstring says why). `frame_specs(spec, info, value_bytes)` cuts a
chunk whose payload is one value per element (raw, bf16) into its payload frames: consecutive row
ranges of at most FRAME_BYTES, whole planes where a plane fits, else tokens of one plane;
`num_frames(...)` is how many, by arithmetic (a received header is checked against it before any
range is built).

bfloat16 has no numpy dtype: it travels as uint16 bit patterns, and the helpers here convert.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from bus.kv.kv_errors import KVValueError

# dtype name -> (numpy storage dtype, bytes per value)
DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(np.uint16),
}
# Measured (bench-kv --sweep): bigger chunks amortise the per-chunk cost of the compiled kernels
# and of the socket; 4 MiB still gives 15 chunks to pipeline for a 1024-token SmolLM2 cache.
DEFAULT_CHUNK_BYTES = 4 * 1024 * 1024
# A raw or bf16 chunk travels as frames of at most this many bytes; the chunk, its checksum and its
# acknowledgement stay one. Why: the same bytes move faster as ~1 MiB frames than as one frame a
# chunk (bench-kv's floor table), and CURVE encrypts frame by frame, so smaller frames pipeline.
FRAME_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class KVInfo:
    """Shape (layers, 2, kv_heads, tokens, head_dim) and dtype name of one request's KV."""

    shape: tuple[int, int, int, int, int]
    dtype: str

    def __post_init__(self) -> None:
        if len(self.shape) != 5 or self.shape[1] != 2 or min(self.shape) < 1:
            raise KVValueError(f"KV shape must be (layers, 2, kv_heads, tokens, head_dim), got {self.shape}")
        if self.dtype not in DTYPES:
            raise KVValueError(f"unsupported KV dtype {self.dtype!r}; expected one of {sorted(DTYPES)}")

    @property
    def num_planes(self) -> int:
        return self.shape[0] * 2 * self.shape[2]

    @property
    def num_tokens(self) -> int:
        return self.shape[3]

    @property
    def head_dim(self) -> int:
        return self.shape[4]

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype].itemsize

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize


@dataclass(frozen=True, slots=True)
class ChunkSpec:
    """One chunk: planes [plane_start, plane_stop) x tokens [token_start, token_stop)."""

    index: int
    plane_start: int
    plane_stop: int
    token_start: int
    token_stop: int

    @property
    def num_rows(self) -> int:
        """Rows of head_dim values in this chunk (the unit of int8 scales)."""
        return (self.plane_stop - self.plane_start) * (self.token_stop - self.token_start)

    @property
    def planes(self) -> slice:
        return slice(self.plane_start, self.plane_stop)

    @property
    def tokens(self) -> slice:
        return slice(self.token_start, self.token_stop)


def planes_per_chunk(info: KVInfo, chunk_bytes: int) -> int:
    """Whole planes per chunk, rounded down to whole layers when a layer fits."""
    plane_bytes = info.num_tokens * info.head_dim * info.itemsize
    per_layer = 2 * info.shape[2]
    planes = max(1, chunk_bytes // plane_bytes)
    return planes - planes % per_layer if planes >= per_layer else planes


def chunk_bytes_for(info: KVInfo, mode: str, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> int:
    """The engine's bytes per chunk of a transfer in `mode`: `chunk_bytes` for raw; a quantized
    chunk covers the values of `chunk_bytes` of a 2-byte source (4 MiB of bf16 = 2 Mi values, so
    8 MiB of float32), which puts about 2 MiB of int8 codes on the wire whatever the source. Why:
    a quantized chunk's cost is its codec pass over the values, not its source bytes, so sizing
    chunks by values keeps the codec's pipeline depth the same for every source dtype (raw
    transfers gained nothing from larger chunks)."""
    return chunk_bytes if mode == "raw" else max(1, chunk_bytes * info.itemsize // 2)


def plan_chunks(info: KVInfo, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> list[ChunkSpec]:
    """Split the KV into chunks of about `chunk_bytes` of the engine's bytes each."""
    if chunk_bytes < 1:
        raise KVValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    row_bytes = info.head_dim * info.itemsize
    if info.num_tokens * row_bytes <= chunk_bytes:
        step = planes_per_chunk(info, chunk_bytes)
        bounds = [(p, min(p + step, info.num_planes), 0, info.num_tokens)
                  for p in range(0, info.num_planes, step)]
    else:
        step = max(1, chunk_bytes // row_bytes)
        bounds = [(p, p + 1, t, min(t + step, info.num_tokens))
                  for p in range(info.num_planes) for t in range(0, info.num_tokens, step)]
    return [ChunkSpec(i, *b) for i, b in enumerate(bounds)]


def as_planes(array: np.ndarray, info: KVInfo) -> np.ndarray:
    """View a (layers, 2, heads, tokens, head_dim) array as (planes, tokens, head_dim)."""
    return array.reshape(info.num_planes, info.num_tokens, info.head_dim)


def numpy_kv_info(array: np.ndarray, dtype: str | None = None) -> KVInfo:
    """KVInfo of a numpy array; uint16 arrays must say dtype='bfloat16'."""
    if dtype is None:
        names = {v: k for k, v in DTYPES.items() if k != "bfloat16"}
        if array.dtype not in names:
            raise KVValueError(f"numpy dtype {array.dtype} needs an explicit KV dtype (bfloat16 is uint16)")
        dtype = names[array.dtype]
    if DTYPES.get(dtype) != array.dtype:
        raise KVValueError(f"array of {array.dtype} cannot hold KV dtype {dtype!r}")
    return KVInfo(tuple(int(n) for n in array.shape), dtype)  # type: ignore[arg-type]


def bf16_bits_to_f32(bits: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """uint16 bfloat16 bit patterns -> float32 (exact)."""
    wide = bits.astype(np.uint32) << 16
    if out is None:
        return wide.view(np.float32)
    np.copyto(out, wide.view(np.float32))
    return out


def f32_to_bf16_bits(values: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """float32 -> bfloat16 bit patterns, rounding to nearest even (as torch does)."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounding = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    rounded = ((bits + rounding) >> 16).astype(np.uint16)
    nan = np.isnan(values)
    if nan.any():  # keep NaN a NaN: the carry above would turn some into infinities
        rounded[nan] = 0x7FC0
    if out is None:
        return rounded
    np.copyto(out, rounded)
    return out


def frame_specs(spec: ChunkSpec, info: KVInfo, value_bytes: int, frame_bytes: int = FRAME_BYTES) -> list[ChunkSpec]:
    """The payload frames of a chunk of `value_bytes` per value: consecutive row ranges in the
    chunk's row order (so consecutive byte ranges of its payload), each at most `frame_bytes` when
    a row allows it. Whole planes a frame while a plane fits; else each plane's tokens in pieces.
    Every range keeps the chunk's index; one frame is the chunk itself."""
    if frame_bytes < 1:
        raise KVValueError(f"frame_bytes must be positive, got {frame_bytes}")
    row_bytes = info.head_dim * value_bytes
    plane_bytes = (spec.token_stop - spec.token_start) * row_bytes
    if spec.num_rows * row_bytes <= frame_bytes:
        return [spec]
    if plane_bytes <= frame_bytes:
        step = frame_bytes // plane_bytes
        return [ChunkSpec(spec.index, p, min(p + step, spec.plane_stop), spec.token_start, spec.token_stop)
                for p in range(spec.plane_start, spec.plane_stop, step)]
    step = max(1, frame_bytes // row_bytes)
    return [ChunkSpec(spec.index, p, p + 1, t, min(t + step, spec.token_stop))
            for p in range(spec.plane_start, spec.plane_stop) for t in range(spec.token_start, spec.token_stop, step)]


def num_frames(spec: ChunkSpec, info: KVInfo, value_bytes: int, frame_bytes: int = FRAME_BYTES) -> int:
    """len(frame_specs(...)) without building them: O(1) whatever the ranges a header claims."""
    row_bytes = info.head_dim * value_bytes
    num_planes, num_tokens = spec.plane_stop - spec.plane_start, spec.token_stop - spec.token_start
    plane_bytes = num_tokens * row_bytes
    if spec.num_rows * row_bytes <= frame_bytes:
        return 1
    if plane_bytes <= frame_bytes:
        return -(-num_planes // (frame_bytes // plane_bytes))
    return num_planes * -(-num_tokens // max(1, frame_bytes // row_bytes))
