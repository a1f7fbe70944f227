"""Per-frame compression: `none`, `lz4`, `zstd` and `auto`, with optional byte-plane shuffle.

Contract: `compress_frame(data, codec, shuffle)` returns the wire bytes of one payload frame, and
`decompress_frame(wire, codec, shuffle, raw_len)` returns exactly `raw_len` bytes or raises
KVFrameError (a corrupt frame never escapes as a library error). `codec` on the wire is
`none` (stored), `lz4` (lz4 block) or `zstd` (level 1); `shuffle` is 0 or the element size whose
bytes are grouped into planes first (as Blosc does: the exponent bytes of floats compress).

`AutoCompression` decides per chunk, from a small sample and the link speed, whether compressing
pays: the time saved on the link must beat the time spent compressing and decompressing, else
the frame is stored. The decision is cached per payload kind (mode, dtype, frame) and re-sampled
after RESAMPLE_EVERY chunks; each re-sample that confirms the choice doubles the wait (up to
MAX_RESAMPLE_EVERY chunks), one that changes it starts over at RESAMPLE_EVERY. So `auto` costs
well under 1% of a transfer when it stores, and a payload kind that changes is followed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import lz4.block
import numpy as np
import zstandard

from bus.kv.kv_errors import KVFrameError

CODECS = ("none", "lz4", "zstd")
COMPRESSION_MODES = ("none", "lz4", "zstd", "auto")
ZSTD_LEVEL = 1
# Sampling costs ~50 us per frame kind and candidate. Once per 32 chunks cost 2-3% of a transfer
# of raw KV on loopback (four candidates with shuffle; a 1024-token bf16 cache is 6 chunks, 1 ms of
# sender CPU), hence the back-off: the payload kinds of one model's KV do not change their nature.
SAMPLE_BYTES = 3 * 8 * 1024
RESAMPLE_EVERY = 32
MAX_RESAMPLE_EVERY = 512
# Decompression runs ~3-4x faster than compression for both codecs (measured in bench-kv).
DECOMPRESS_COST_FACTOR = 1.3
SAFETY_MARGIN = 1.2

_zstd_compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
_zstd_decompressor = zstandard.ZstdDecompressor()


def shuffle_bytes(data, itemsize: int) -> np.ndarray:
    """Group byte k of every element together (bytes of planes); len(data) % itemsize == 0."""
    array = np.frombuffer(data, np.uint8)
    return np.ascontiguousarray(array.reshape(-1, itemsize).T).reshape(-1)


def unshuffle_bytes(data, itemsize: int) -> np.ndarray:
    array = np.frombuffer(data, np.uint8)
    return np.ascontiguousarray(array.reshape(itemsize, -1).T).reshape(-1)


def compress_frame(data, codec: str, shuffle: int = 0):
    """Wire bytes of `data` under `codec` (`none` returns `data` itself: no copy)."""
    if codec == "none":
        return data
    if shuffle:
        data = shuffle_bytes(data, shuffle)
    if codec == "lz4":
        return lz4.block.compress(data, store_size=False)
    if codec == "zstd":
        return _zstd_compressor.compress(data)
    raise KVFrameError(f"unknown codec {codec!r}")


def decompress_frame(wire, codec: str, shuffle: int, raw_len: int):
    """The `raw_len` payload bytes of a wire frame; KVFrameError on any corruption."""
    if codec == "none":
        if len(memoryview(wire).cast("B")) != raw_len:
            raise KVFrameError("stored frame length does not match its header")
        return wire
    try:
        if codec == "lz4":
            data = lz4.block.decompress(wire, uncompressed_size=raw_len)
        elif codec == "zstd":
            data = _zstd_decompressor.decompress(bytes(wire), max_output_size=raw_len)
        else:
            raise KVFrameError(f"unknown codec {codec!r}")
    except (lz4.block.LZ4BlockError, zstandard.ZstdError, ValueError, MemoryError) as exc:
        raise KVFrameError(f"corrupt {codec} frame: {exc}") from exc
    if len(data) != raw_len:
        raise KVFrameError(f"{codec} frame decompressed to {len(data)} bytes, header says {raw_len}")
    return unshuffle_bytes(data, shuffle) if shuffle else data


@dataclass(frozen=True, slots=True)
class Choice:
    codec: str
    shuffle: int


def _sample(data) -> bytes:
    view = memoryview(data).cast("B")
    if len(view) <= SAMPLE_BYTES:
        return bytes(view)
    part = SAMPLE_BYTES // 3
    middle = len(view) // 2
    return bytes(view[:part]) + bytes(view[middle:middle + part]) + bytes(view[-part:])


def pays_off(raw_len: int, wire_len: int, compress_seconds: float, link_bytes_per_s: float) -> bool:
    """Compressing a frame pays when the link time it saves beats the CPU time it costs."""
    saved = (raw_len - wire_len) / link_bytes_per_s
    return saved > compress_seconds * DECOMPRESS_COST_FACTOR * SAFETY_MARGIN


class AutoCompression:
    """Samples frames and picks `none`, `lz4` or `zstd` (+shuffle) per payload slot."""

    def __init__(self, link_bytes_per_s: float, candidates: tuple[Choice, ...] | None = None) -> None:
        self.link_bytes_per_s = link_bytes_per_s
        self.candidates = candidates
        self._choices: dict[object, Choice] = {}
        self._age: dict[object, int] = {}
        self._interval: dict[object, int] = {}

    def choose(self, slot: object, data, itemsize: int) -> Choice:
        """The codec for a frame; `slot` names similar frames (mode, dtype, frame position)."""
        age = self._age.get(slot)
        if age is not None and age < self._interval[slot]:
            self._age[slot] = age + 1
            return self._choices[slot]
        choice = self._measure(data, itemsize)
        confirmed = self._choices.get(slot) == choice
        interval = min(2 * self._interval[slot], MAX_RESAMPLE_EVERY) if confirmed else RESAMPLE_EVERY
        self._choices[slot], self._age[slot], self._interval[slot] = choice, 1, interval
        return choice

    def resample_interval(self, slot: object) -> int:
        """Chunks between two samples of `slot` now (RESAMPLE_EVERY before its first)."""
        return self._interval.get(slot, RESAMPLE_EVERY)

    def _measure(self, data, itemsize: int) -> Choice:
        sample = _sample(data)
        best, best_cost = Choice("none", 0), len(sample) / self.link_bytes_per_s
        for choice in self.candidates or default_candidates(itemsize):
            started = time.perf_counter()
            wire = compress_frame(sample, choice.codec, choice.shuffle)
            seconds = time.perf_counter() - started
            if not pays_off(len(sample), len(wire), seconds, self.link_bytes_per_s):
                continue
            cost = len(wire) / self.link_bytes_per_s + seconds * DECOMPRESS_COST_FACTOR
            if cost < best_cost:
                best, best_cost = choice, cost
        return best


def default_candidates(itemsize: int) -> tuple[Choice, ...]:
    """lz4 and zstd, each on shuffled bytes too when the payload holds multi-byte values."""
    plain = (Choice("lz4", 0), Choice("zstd", 0))
    return plain + ((Choice("lz4", itemsize), Choice("zstd", itemsize)) if itemsize > 1 else ())
