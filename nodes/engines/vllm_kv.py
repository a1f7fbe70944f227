"""Copy a request's KV between vLLM's paged cache and pdbus's plain KV tensor. Pure torch, no vLLM.

pdbus's KV seam (see `base.py`) is one tensor per request, `[layers, 2 (K, V), kv_heads, tokens,
head_dim]`. vLLM keeps one paged tensor per attention layer and a request owns a list of block ids;
token `t` lives in block `block_ids[t // block_size]` at offset `t % block_size`. Two layer layouts
are understood, told apart by shape:

- CPU (`CPU_ATTN`): `[num_blocks, kv_heads, block_size, 2 * head_dim]`, where each (block, head)
  holds `block_size * head_dim` key elements then as many value elements, in an order that depends
  on the CPU's kernel (AMX packs pairs of channels per token, the plain kernel stores keys
  transposed, ...). pdbus does not guess that order: `probe_cpu_order` writes index-coded K and V
  through vLLM's own cache writer into a scratch block and reads back where each (token, channel)
  landed. The copy is then a gather/scatter by that permutation, right for whatever kernel runs.
- GPU flash-attention style (NHD): `[2, num_blocks, block_size, kv_heads, head_dim]` (untested
  here: no GPU on this project's machines).

Contract:
- `probe_cpu_order(write, block_size, head_dim, dtype) -> (key_order, value_order)`; `write(K, V,
  key_cache, value_cache, slot_mapping)` is the kernel's cache writer (K, V: [tokens, 1, head_dim]).
  Each order maps logical `t * head_dim + d` to its position in the block's region.
- `paged_layout(layer, num_kv_heads, head_dim, cpu_order=None) -> PagedLayout` (`KvLayoutError` for
  a shape it does not know; a CPU layer needs `cpu_order`).
- `gather(layers, block_ids, num_tokens, layout) -> Tensor` copies tokens `[0, num_tokens)` out.
- `scatter(layers, block_ids, kv, start, layout)` writes `kv` (tokens `[start, start + n)`) in,
  leaving the blocks' other tokens as they were; `kv` is cast to the cache's dtype.
Both raise `KvLayoutError` when `block_ids` do not cover the tokens or shapes disagree.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch


class KvLayoutError(ValueError):
    """A paged layer or a KV tensor that does not match what the copy expects."""


@dataclass(frozen=True)
class PagedLayout:
    kind: Literal["cpu", "nhd"]
    block_size: int
    num_kv_heads: int
    head_dim: int
    key_order: torch.Tensor | None = None     # cpu: logical index -> position in the block's K region
    value_order: torch.Tensor | None = None


def probe_cpu_order(write: Callable[..., None], block_size: int, head_dim: int,
                    dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Where the kernel puts each (token, channel) of a block, found by writing coded values."""
    if max(block_size, head_dim) > 256 and dtype == torch.bfloat16:
        raise KvLayoutError("cannot code more than 256 positions exactly in bfloat16")
    tokens = torch.arange(block_size, dtype=torch.float32).view(-1, 1, 1).expand(block_size, 1, head_dim)
    channels = torch.arange(head_dim, dtype=torch.float32).view(1, 1, -1).expand(block_size, 1, head_dim)
    found = []
    for coded in (tokens, channels):
        cache = torch.full((1, 1, block_size, 2 * head_dim), -1.0, dtype=dtype)
        halves = cache.view(1, 1, 2 * block_size, head_dim)
        coded = coded.to(dtype).contiguous()
        write(coded, coded, halves[:, :, :block_size], halves[:, :, block_size:], torch.arange(block_size))
        found.append(cache.view(2, block_size * head_dim).float())
    (token_of, channel_of) = found
    orders = []
    for half in (0, 1):
        logical = (token_of[half] * head_dim + channel_of[half]).long()
        order = torch.full((block_size * head_dim,), -1, dtype=torch.long)
        order[logical.clamp(min=0)] = torch.arange(block_size * head_dim)
        if (token_of[half] < 0).any() or (order < 0).any():
            raise KvLayoutError("the kernel's cache writer is not a permutation of (token, channel): "
                                "pdbus cannot copy this KV layout")
        orders.append(order)
    return orders[0], orders[1]


def paged_layout(layer: torch.Tensor, num_kv_heads: int, head_dim: int,
                 cpu_order: tuple[torch.Tensor, torch.Tensor] | None = None) -> PagedLayout:
    shape = tuple(layer.shape)
    if len(shape) == 4 and shape[1] == num_kv_heads and shape[3] == 2 * head_dim:
        if cpu_order is None:
            raise KvLayoutError("a CPU paged layer needs the kernel's element order (probe_cpu_order)")
        return PagedLayout("cpu", shape[2], num_kv_heads, head_dim, cpu_order[0], cpu_order[1])
    if len(shape) == 5 and shape[0] == 2 and shape[3] == num_kv_heads and shape[4] == head_dim:
        return PagedLayout("nhd", shape[2], num_kv_heads, head_dim)
    raise KvLayoutError(f"unsupported paged KV layer shape {shape} for {num_kv_heads} KV heads of "
                        f"{head_dim}: pdbus understands the CPU [blocks, heads, block, 2*dim] and the "
                        "[2, blocks, block, heads, dim] layouts")


def _block_span(block_ids: Sequence[int], start: int, num_tokens: int, block_size: int) -> tuple[int, int]:
    end = start + num_tokens
    if start < 0 or num_tokens < 0 or end > len(block_ids) * block_size:
        raise KvLayoutError(f"tokens [{start}, {end}) do not fit in {len(block_ids)} blocks of {block_size}")
    return start // block_size, -(-end // block_size)


def _cpu_read(layer: torch.Tensor, blocks: torch.Tensor, layout: PagedLayout) -> torch.Tensor:
    """[2, heads, len(blocks) * block_size, head_dim] in logical order."""
    assert layout.key_order is not None and layout.value_order is not None   # a "cpu" layout has them
    regions = layer.view(layer.shape[0], layout.num_kv_heads, 2, -1)[blocks]    # [n, heads, 2, bs*dim]
    keys = regions[:, :, 0].index_select(-1, layout.key_order)
    values = regions[:, :, 1].index_select(-1, layout.value_order)
    both = torch.stack((keys, values))                                           # [2, n, heads, bs*dim]
    both = both.view(2, len(blocks), layout.num_kv_heads, layout.block_size, layout.head_dim)
    return both.permute(0, 2, 1, 3, 4).reshape(2, layout.num_kv_heads, -1, layout.head_dim)


def _cpu_write(layer: torch.Tensor, blocks: torch.Tensor, logical: torch.Tensor, layout: PagedLayout) -> None:
    assert layout.key_order is not None and layout.value_order is not None   # a "cpu" layout has them
    num_blocks = len(blocks)
    per_block = logical.view(2, layout.num_kv_heads, num_blocks, -1).permute(0, 2, 1, 3)   # [2, n, heads, bs*dim]
    regions = layer.view(layer.shape[0], layout.num_kv_heads, 2, -1)
    physical = torch.empty((num_blocks, layout.num_kv_heads, 2, per_block.shape[-1]), dtype=layer.dtype)
    physical[:, :, 0].index_copy_(-1, layout.key_order, per_block[0])
    physical[:, :, 1].index_copy_(-1, layout.value_order, per_block[1])
    regions[blocks] = physical


def gather(layers: Sequence[torch.Tensor], block_ids: Sequence[int], num_tokens: int,
           layout: PagedLayout) -> torch.Tensor:
    """The request's KV for tokens [0, num_tokens) as [layers, 2, kv_heads, tokens, head_dim]."""
    first, last = _block_span(block_ids, 0, num_tokens, layout.block_size)
    blocks = torch.as_tensor(list(block_ids[first:last]), dtype=torch.long, device=layers[0].device)
    out = torch.empty((len(layers), 2, layout.num_kv_heads, num_tokens, layout.head_dim), dtype=layers[0].dtype,
                      device=layers[0].device)
    for index, layer in enumerate(layers):
        if layout.kind == "cpu":
            out[index] = _cpu_read(layer, blocks, layout)[:, :, :num_tokens]
        else:
            chunk = layer[:, blocks].reshape(2, -1, layout.num_kv_heads, layout.head_dim)[:, :num_tokens]
            out[index] = chunk.transpose(1, 2)
    return out


def scatter(layers: Sequence[torch.Tensor], block_ids: Sequence[int], kv: torch.Tensor, start: int,
            layout: PagedLayout) -> None:
    """Write `kv` [layers, 2, kv_heads, n, head_dim] as tokens [start, start + n) of the request."""
    if kv.dim() != 5 or (kv.shape[0], kv.shape[1], kv.shape[2], kv.shape[4]) != (
            len(layers), 2, layout.num_kv_heads, layout.head_dim):
        raise KvLayoutError(f"KV of shape {tuple(kv.shape)} does not fit a cache of "
                            f"[{len(layers)}, 2, {layout.num_kv_heads}, tokens, {layout.head_dim}]")
    num_tokens = int(kv.shape[3])
    first, last = _block_span(block_ids, start, num_tokens, layout.block_size)
    blocks = torch.as_tensor(list(block_ids[first:last]), dtype=torch.long, device=layers[0].device)
    offset = start - first * layout.block_size
    kv = kv.to(device=layers[0].device, dtype=layers[0].dtype)
    for index, layer in enumerate(layers):
        if layout.kind == "cpu":
            logical = _cpu_read(layer, blocks, layout)     # keep the blocks' other tokens
            logical[:, :, offset:offset + num_tokens] = kv[index]
            _cpu_write(layer, blocks, logical, layout)
        else:
            chunk = layer[:, blocks].reshape(2, -1, layout.num_kv_heads, layout.head_dim)
            chunk[:, offset:offset + num_tokens] = kv[index].transpose(1, 2)
            layer[:, blocks] = chunk.view(2, len(blocks), layout.block_size, layout.num_kv_heads, layout.head_dim)
