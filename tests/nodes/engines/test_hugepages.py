"""Huge-page-backed CPU tensors: the advice is taken where the kernel offers THP, an arena's views
hold their values at 64-byte boundaries, and a full arena says so."""

from __future__ import annotations

import mmap
import re
import sys
from pathlib import Path

import pytest
import torch

from nodes.engines import hugepages

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def thp_mode() -> str | None:
    match = re.search(r"\[(\w+)\]", THP.read_text()) if THP.exists() else None
    return match.group(1) if match else None


def mapping_of(tensor: torch.Tensor) -> str:
    """The /proc/self/smaps block of the mapping holding the tensor's middle byte (the advice splits
    the mapping at page boundaries, so its first bytes may lie in a mapping of their own)."""
    address = tensor.data_ptr() + tensor.numel() * tensor.element_size() // 2
    for block in re.split(r"\n(?=[0-9a-f]+-[0-9a-f]+ )", Path("/proc/self/smaps").read_text()):
        low, high = (int(x, 16) for x in block.split()[0].split("-"))
        if low <= address < high:
            return block
    return ""


@pytest.mark.skipif(not sys.platform.startswith("linux") or thp_mode() not in ("madvise", "always"),
                    reason="no transparent huge pages to ask for")
def test_a_large_tensor_is_advised_onto_huge_pages():
    """The advice is in force on its mapping (VmFlags "hg"); whether the kernel then finds free huge
    pages depends on the machine's memory, so only the flag is asserted."""
    tensor = hugepages.empty((64 << 20,), torch.uint8)   # 64 MiB
    tensor.zero_()
    flags = re.search(r"VmFlags:(.*)", mapping_of(tensor)).group(1).split()
    assert "hg" in flags
    # The control: an anonymous mapping of our own, never advised (a torch allocation's placement,
    # and so the mapping its middle byte lies in, depends on what the process freed before).
    with mmap.mmap(-1, 64 << 20) as plain:
        control = torch.frombuffer(plain, dtype=torch.uint8)
        assert "hg" not in re.search(r"VmFlags:(.*)", mapping_of(control)).group(1).split()
        del control


def test_small_tensors_are_not_advised_and_never_fail():
    assert hugepages.advise(torch.empty(1024)) is False
    assert hugepages.empty((3, 5), torch.bfloat16).shape == (3, 5)


def test_an_arena_copies_tensors_at_64_byte_boundaries_until_it_is_full():
    shapes = [(3, 7), (5,), (2, 2, 2)]
    arena = hugepages.Arena(shapes, torch.bfloat16)
    sources = [torch.randn(shape).to(torch.bfloat16) for shape in shapes]
    copies = [arena.copy(source) for source in sources]
    for source, copy in zip(sources, copies, strict=True):
        assert torch.equal(source, copy) and copy.is_contiguous()
        assert copy.data_ptr() % 64 == 0
    with pytest.raises(ValueError, match="arena is full"):
        arena.copy(torch.zeros(100, dtype=torch.bfloat16))
