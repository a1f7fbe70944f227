"""The KV codec on the engine's device: the wire's int8 and bf16 encodings computed where the KV is.

Contract:
- `encode_int8_rows(rows, codes, lo, hi) -> fits`: rows (R, D) of any float dtype on any device;
  writes uint8 codes (R, D) and float16 params lo, hi (R,) on that device, and returns a 0-d bool
  tensor (not read here: reading it would wait for the device) that is False when a row holds a
  non-finite value or a range float16 cannot hold. Where it is True, codes and params are bit for
  bit those of bus.kv.quant's numpy reference (`int8` mode, `f16` params); where it is False the
  caller must encode those rows with the reference, which raises or sends float32 params.
- `decode_int8_rows(codes, lo, hi, out)`: codes (R, D), out any shape of R * D values; the
  reference's dequantization, x = code * step + lo in float32, rounded to `out`'s dtype (round to
  nearest even, as the reference's bfloat16 is).
`host_numpy(tensor)` / `host_bytes(tensor)`: a CPU tensor as numpy sees it (bfloat16 as uint16 bits,
numpy having no bfloat16) / its bytes, both views.
bf16 mode needs no code here: torch's conversion rounds to nearest even, as the reference does
(tests/nodes/engines/test_kv_export.py checks its payloads from a float32 engine).

Why eager torch ops and not one fused kernel: each op rounds once in float32 exactly as numpy's
does, on a CPU and on a GPU alike. A fused kernel (inductor, Triton) may contract `a * b + c` into
one fused multiply-add, which rounds once instead of twice and moves a value across a code
boundary; the reference and the decoder would then disagree. The ops are memory-bound, so the cost
of separate passes is bandwidth: about 29 bytes moved per value to encode, 19 to decode (against 2
for a bf16 source), measured per stage by `make bench-kv-device`.
"""

from __future__ import annotations

import numpy as np
import torch

TORCH_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}   # KV dtype names
NAMES_TO_TORCH = {name: dtype for dtype, name in TORCH_DTYPES.items()}
OUTWARD = 2.0**-10   # as bus.kv.quant: > half a float16 ulp, relative, so rounding stays outward
F16_TINY = 2.0**-24  # the float16 subnormal step


def outward_f16(low: torch.Tensor, high: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """lo, hi = float16 of the widened float32 range (bus.kv.quant.outward_params' expression,
    one rounding per op); returns whether both are finite."""
    lo.copy_(low.sub(low.abs().mul_(OUTWARD).add_(F16_TINY)))
    hi.copy_(high.add(high.abs().mul_(OUTWARD).add_(F16_TINY)))
    return torch.isfinite(lo).all() & torch.isfinite(hi).all()


def int8_inverse_step(lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(step, 1 / step or 0) in float32 per row, as bus.kv.quant.int8_step and its encoder."""
    lo32 = lo.float()
    step = hi.float().sub_(lo32).div_(255.0)
    inverse = torch.where(step > 0, torch.reciprocal(step), torch.zeros_like(step))
    return step, inverse


def encode_int8_rows(rows: torch.Tensor, codes: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    # The row range read from the source dtype (its min and max are the same values in float32).
    low, high = torch.aminmax(rows, dim=1)
    fits = outward_f16(low.float(), high.float(), lo, hi)
    _, inverse = int8_inverse_step(lo, hi)
    work = torch.sub(rows, lo.float()[:, None])   # in float32: the source promotes exactly
    work.mul_(inverse[:, None]).add_(0.5)   # then truncation = round half up, within [0, 256)
    # Within [0, 256) for every row that fits (lo <= x <= hi, so (x - lo) / step <= 255 plus a few
    # ulps), where the conversion truncates as the reference's C cast does; the codes of rows that
    # do not fit are never sent (the caller takes the reference's path), so they need no clamp.
    codes.copy_(work)
    return fits


def decode_int8_rows(codes: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, out: torch.Tensor) -> None:
    step, _ = int8_inverse_step(lo, hi)
    values = torch.mul(codes, step[:, None]).view(out.shape)   # uint8 x float32: float32 products
    # The sum rounds to float32, then to out's dtype on the store (round to nearest even), as the
    # reference's two roundings: one pass fewer than adding, then copying.
    torch.add(values, lo.float()[:, None].view(*out.shape[:-1], 1), out=out)


def host_numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.view(torch.int16).numpy().view(np.uint16) if tensor.dtype == torch.bfloat16 else tensor.numpy()


def host_bytes(tensor: torch.Tensor) -> np.ndarray:
    """The bytes of a contiguous CPU tensor, as a flat uint8 view."""
    return host_numpy(tensor).reshape(-1).view(np.uint8)
