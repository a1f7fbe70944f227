"""The fast torch path of the KV quantization modes, pluggable into bus/kv as a `Quantizer`.

Contract: `TorchQuantizer(compile=True)` implements bus.kv.quant.Quantizer for torch tensors
(float32, bfloat16, float16; layout layers x 2 x kv_heads x tokens x head_dim), producing byte for
byte the payload format of bus.kv.quant (the numpy reference) and decoding it straight into a
preallocated torch destination of the engine's dtype. Anything that is not a torch tensor is handed
to the numpy quantizer. With `compile=True`, the default `int8` mode runs on the single-pass numba
kernels of kernels.kv_int8 (float32, bfloat16 and float16 sources; float32 and bfloat16
destinations), whose payloads and decoded values are bit-identical to the numpy reference's; they
beat the inductor kernels (docs/KERNELS.md). Every other mode and
dtype runs under `torch.compile` (dynamic shapes, so one compile serves every chunk size);
`compile=False`, a missing numba or a failing compiler give eager torch.
`warmup()` compiles everything at start-up (the first compile takes seconds; both cache on disk).
The torch kernels agree with numpy up to one code step where float rounding ties differ.
Two device paths plug in here: a `DeviceExport` (nodes/engines/kv_export.py: KV a GPU engine
encoded as it computed it) is read chunk by chunk as it is, and a destination on a GPU (or any
destination with `on_device=True`) is decoded there by `device_landing` (kv_landing.py).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from bus.kv.kv_errors import KVValueError
from bus.kv.layout import ChunkSpec, KVInfo, plan_chunks
from bus.kv.quant import EncodedPayload, NumpyQuantizer
from nodes.engines.kernels import dispatch
from nodes.engines.kernels.kv_int8 import decode as int8_decode
from nodes.engines.kernels.kv_int8 import encode as int8_kernels
from nodes.engines.kv_device import F16_TINY, NAMES_TO_TORCH, OUTWARD, TORCH_DTYPES, host_bytes, host_numpy
from nodes.engines.kv_export import DeviceExport
from nodes.engines.kv_landing import DeviceLanding, decode_by_reference

# Received payloads are read-only ZeroMQ frames; the decoder only reads the tensors it views them as.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable", category=UserWarning)

F16_MAX = 65504.0


def _outward(low: torch.Tensor, high: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """lo <= low, hi >= high in float32, such that rounding them to float16 stays outward: the
    expression of bus.kv.quant.outward_params. Returns also whether both fit float16."""
    low, high = low.float(), high.float()
    lo = low - (low.abs() * OUTWARD + F16_TINY)
    hi = high + (high.abs() * OUTWARD + F16_TINY)
    fits = (lo >= -F16_MAX).all() & (hi <= F16_MAX).all()   # NaN fails both comparisons too
    return lo, hi, fits


def asym_params(low: torch.Tensor, high: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """params = float16 [lo | hi] (the store rounds them); returns whether they fit float16."""
    lo, hi, fits = _outward(low, high)
    num_rows = low.shape[0]
    params[:num_rows].copy_(lo)
    params[num_rows:].copy_(hi)
    return fits


def sym_params(low: torch.Tensor, high: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """params = float16 [scale], scale = max|x| / 127 rounded up; returns whether it fits."""
    amax = torch.maximum(low.float().abs(), high.float().abs()) / 127.0
    _, scale, fits = _outward(amax, amax)
    params.copy_(scale)
    return fits


def quantize_asym(rows: torch.Tensor, params: torch.Tensor, codes: torch.Tensor) -> None:
    """uint8 codes (R, D) from rows and the float16 params read back from memory (the decoder's
    values). Going through int32 vectorises the float->uint8 conversion (2x faster here)."""
    num_rows = rows.shape[0]
    lo, hi = params[:num_rows].float(), params[num_rows:].float()
    step = (hi - lo) / 255.0
    inverse = torch.where(step > 0, 1.0 / step, torch.zeros_like(step))
    scaled = (rows.float() - lo[:, None]) * inverse[:, None] + 0.5
    codes.copy_(scaled.clamp(0.0, 255.5).to(torch.int32).to(torch.uint8))


def quantize_sym(rows: torch.Tensor, params: torch.Tensor, codes: torch.Tensor) -> None:
    """int8 codes (R, D) in [-127, 127] from rows and the float16 scales."""
    scale = params.float()
    inverse = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
    scaled = torch.round(rows.float() * inverse[:, None])
    codes.copy_(scaled.clamp(-127.0, 127.0).to(torch.int32).to(torch.int8))


def decode_int8_rows(codes: torch.Tensor, params: torch.Tensor, out: torch.Tensor) -> None:
    """codes (P, T, D) uint8, params (2R,) [lo | hi] -> out (P, T, D) of the engine's dtype."""
    rows = codes.shape[0] * codes.shape[1]
    lo, hi = params[:rows].float(), params[rows:].float()
    step = ((hi - lo) / 255.0).view(codes.shape[0], codes.shape[1], 1)
    values = codes.to(torch.int32).float() * step + lo.view(codes.shape[0], codes.shape[1], 1)
    out.copy_(values.to(out.dtype))


def decode_int8_sym_rows(codes: torch.Tensor, params: torch.Tensor, out: torch.Tensor) -> None:
    scale = params.float().view(codes.shape[0], codes.shape[1], 1)
    out.copy_((codes.to(torch.int32).float() * scale).to(out.dtype))


def convert_into(source: torch.Tensor, out: torch.Tensor) -> None:
    out.copy_(source.to(out.dtype))



KERNELS: dict[str, Callable[..., Any]] = {
    "params_int8": asym_params, "params_int8_sym": sym_params, "quantize_int8": quantize_asym,
    "quantize_int8_sym": quantize_sym, "decode_int8": decode_int8_rows,
    "decode_int8_sym": decode_int8_sym_rows, "convert": convert_into,
}


class TorchQuantizer:
    """Compiled torch kernels for torch KV; numpy fallback for everything else."""

    def __init__(self, compile: bool = True, on_device: bool = False) -> None:
        self.numpy = NumpyQuantizer()
        self.on_device = on_device   # CPU destinations decoded by the device path too (tests of it)
        self.compile = compile
        # Compiled lazily per (kernel, argument dtypes), with dynamic shapes so that chunk and
        # prompt sizes do not trigger recompiles (dynamo gives up after 8 and runs eager).
        self._compiled: dict[tuple, Any] = {}
        self._scratch = torch.empty(0)
        self.fast_int8 = compile and dispatch.kv_int8_backend() == "numba"   # `int8` on kernels.kv_int8
        self._work = int8_kernels.Scratch(64)
        self.device_landing = DeviceLanding(self)   # destinations on a GPU: decoded there

    @property
    def compiled(self) -> bool:
        return self.compile

    def _run(self, name: str, *args: torch.Tensor) -> Any:
        if not self.compile:
            return KERNELS[name](*args)
        key = (name, *(a.dtype for a in args))
        kernel = self._compiled.get(key)
        if kernel is None:
            kernel = self._compiled[key] = torch.compile(KERNELS[name], dynamic=True)
        try:
            return kernel(*args)
        except Exception:  # no working compiler toolchain: eager from now on
            self.compile = False
            return KERNELS[name](*args)

    def warmup(self, dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16)) -> None:
        """Compile every kernel on a small KV (two chunk sizes, so dynamic shapes are traced)."""
        for dtype in dtypes:
            kv = torch.randn(2, 2, 2, 16, 64).to(dtype)
            info = self.kv_info(kv)
            for chunk_bytes in (8 * 64 * kv.element_size(), 4 * 16 * 64 * kv.element_size()):
                for spec in plan_chunks(info, chunk_bytes)[:2]:
                    for mode in ("bf16", "int8", "int8_sym"):
                        outs = [np.empty(spec.num_rows * 64 * 2, np.uint8), np.empty(spec.num_rows * 8, np.uint8)]
                        payload = self.encode(kv, info, spec, mode, outs)
                        # read-only, as received frames are (numba compiles per array type)
                        arrays = [np.frombuffer(bytes(memoryview(f).cast("B")), np.uint8) for f in payload.frames]
                        self.decode(arrays, info, spec, mode, payload.scale_dtype, torch.empty_like(kv))

    def kv_info(self, kv: Any, dtype: str | None = None) -> KVInfo:
        if isinstance(kv, DeviceExport):
            return kv.info
        if not isinstance(kv, torch.Tensor):
            return self.numpy.kv_info(kv, dtype)
        if kv.dtype not in TORCH_DTYPES or kv.device.type != "cpu":
            raise KVValueError(f"torch KV must be a CPU float32/bfloat16/float16 tensor, got {kv.dtype} on {kv.device}")
        if not kv.is_contiguous():
            raise KVValueError("torch KV must be contiguous (layers, 2, kv_heads, tokens, head_dim)")
        return KVInfo(tuple(kv.shape), TORCH_DTYPES[kv.dtype])  # type: ignore[arg-type]

    def dst_dtype(self, dst: Any) -> str:
        if not isinstance(dst, torch.Tensor):
            return self.numpy.dst_dtype(dst)
        if dst.dtype not in TORCH_DTYPES:
            raise KVValueError(f"unsupported destination dtype {dst.dtype}")
        return TORCH_DTYPES[dst.dtype]

    @staticmethod
    def _chunk(tensor: torch.Tensor, info: KVInfo, spec: ChunkSpec) -> torch.Tensor:
        return tensor.view(info.num_planes, info.num_tokens, info.head_dim)[spec.planes, spec.tokens]

    def encode(self, kv: Any, info: KVInfo, spec: ChunkSpec, mode: str, outs: list[np.ndarray]) -> EncodedPayload:
        if isinstance(kv, DeviceExport):   # encoded on the device already: the chunk's bytes
            return kv.encode(spec, mode, outs, self.numpy)
        if not isinstance(kv, torch.Tensor):
            return self.numpy.encode(kv, info, spec, mode, outs)
        chunk = self._chunk(kv, info, spec)
        if mode == "raw" or (mode == "bf16" and kv.dtype == torch.bfloat16):
            data = chunk if chunk.is_contiguous() else chunk.contiguous()
            return EncodedPayload([host_bytes(data)])
        rows = chunk.reshape(spec.num_rows, info.head_dim)
        if mode == "bf16":
            out = _tensor(outs[0], rows.numel() * 2, torch.bfloat16).view(rows.shape)
            self._run("convert", rows, out)
            return EncodedPayload([outs[0][: rows.numel() * 2]])
        if mode not in ("int8", "int8_sym"):
            raise KVValueError(f"unknown quantization mode {mode!r}")
        return self._encode_int8(kv, info, spec, mode, rows, outs)

    def _encode_int8(self, kv: torch.Tensor, info: KVInfo, spec: ChunkSpec, mode: str, rows: torch.Tensor,
                     outs: list[np.ndarray]) -> EncodedPayload:
        if mode == "int8" and self.fast_int8:
            return self._encode_int8_fast(kv, info, spec, rows, outs)
        num_params = spec.num_rows * (2 if mode == "int8" else 1)
        code_dtype = torch.uint8 if mode == "int8" else torch.int8
        codes = _tensor(outs[0], rows.numel(), code_dtype).view(rows.shape)
        params = _tensor(outs[1], num_params * 2, torch.float16)
        if rows.dtype != torch.float32:  # ATen's bf16 row reductions are ~3x slower than fp32 here
            rows = self._float32_scratch(rows)
        # Row reductions run eager: ATen's are ~5x faster than inductor's here.
        # Two kernels: the second reads the float16 params back from memory, so it quantizes with
        # exactly the decoder's values (one fused kernel ran slower here).
        if not bool(self._run("params_" + mode, rows.amin(dim=1), rows.amax(dim=1), params)):
            # a range beyond float16 (or non-finite KV): float32 params, or a clear error, via numpy
            return self.numpy.encode(host_numpy(kv), info, spec, mode, outs)
        self._run("quantize_" + mode, rows, params, codes)
        return EncodedPayload([outs[0][: rows.numel()], outs[1][: num_params * 2]], "f16")

    def _encode_int8_fast(self, kv: torch.Tensor, info: KVInfo, spec: ChunkSpec, rows: torch.Tensor,
                          outs: list[np.ndarray]) -> EncodedPayload:
        num_rows = spec.num_rows
        codes = outs[0][: rows.numel()].reshape(num_rows, info.head_dim)
        params = outs[1][: num_rows * 4].view(np.uint16)
        if rows.dtype == torch.float16:
            rows = self._float32_scratch(rows)
        source = host_numpy(rows)
        encode = int8_kernels.encode_rows if rows.dtype == torch.float32 else int8_kernels.encode_bf16_rows
        try:
            fits = encode(source, codes, params, self._work)
        except Exception:  # numba cannot compile here: torch kernels from now on
            self.fast_int8 = False
            return self.encode(kv, info, spec, "int8", outs)
        if not fits:  # non-finite KV (an error) or a range beyond float16 (float32 params): numpy
            return self.numpy.encode(host_numpy(kv), info, spec, "int8", outs)
        return EncodedPayload([outs[0][: rows.numel()], outs[1][: num_rows * 4]], "f16")

    def _float32_scratch(self, rows: torch.Tensor) -> torch.Tensor:
        if self._scratch.numel() < rows.numel():
            self._scratch = torch.empty(rows.numel())
        scratch = self._scratch[: rows.numel()].view(rows.shape)
        scratch.copy_(rows)
        return scratch

    def decode(self, payload: list[np.ndarray], info: KVInfo, spec: ChunkSpec, mode: str,
               scale_dtype: str, dst: Any) -> None:
        if not isinstance(dst, torch.Tensor):
            self.numpy.decode(payload, info, spec, mode, scale_dtype, dst)
            return
        target = self._chunk(dst, info, spec)
        if dst.device.type != "cpu" or self.on_device:
            self.device_landing.decode(payload, info, spec, mode, scale_dtype, target)
            return
        shape = target.shape
        if mode == "int8" and scale_dtype == "f16" and self.fast_int8 and self._decode_int8_fast(payload, target):
            return
        if mode in ("int8", "int8_sym") and scale_dtype == "f16":
            code_dtype = torch.uint8 if mode == "int8" else torch.int8
            codes = torch.from_numpy(payload[0]).view(code_dtype).view(shape)
            params = torch.from_numpy(payload[1]).view(torch.float16)
            self._run("decode_" + mode, codes, params, target)
        elif mode == "raw" or mode == "bf16":
            source_dtype = NAMES_TO_TORCH[info.dtype] if mode == "raw" else torch.bfloat16
            source = torch.from_numpy(payload[0]).view(source_dtype).view(shape)
            target.copy_(source) if source_dtype == dst.dtype else self._run("convert", source, target)
        else:  # float32 params (rare): the numpy reference, through a float32 staging buffer
            decode_by_reference(self.numpy, payload, info, spec, mode, scale_dtype, target)

    def _decode_int8_fast(self, payload: list[np.ndarray], target: torch.Tensor) -> bool:
        """Dequantize on kernels.kv_int8 into a float32 or bfloat16 target; False for others."""
        if target.dtype not in (torch.float32, torch.bfloat16):
            return False
        out = target.numpy() if target.dtype == torch.float32 else target.view(torch.int16).numpy().view(np.uint16)
        try:
            int8_decode.decode_rows(payload[0].reshape(target.shape), payload[1].view(np.uint16), out, self._work)
        except Exception:  # numba cannot compile here: torch kernels from now on
            self.fast_int8 = False
            return False
        return True


def _tensor(buffer: np.ndarray, nbytes: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.from_numpy(buffer[:nbytes]).view(dtype)
