"""Weights on transparent huge pages: a batch-1 decode step streams every weight once, and with 4 KiB
pages that is a TLB miss every 4 KiB of it.

Linux backs an anonymous mapping with 2 MiB pages when transparent huge pages are `always`, or
`madvise` and the mapping was advised MADV_HUGEPAGE (the kernel's admin-guide/mm/transhuge.rst: with
`madvise`, huge pages only "inside MADV_HUGEPAGE madvise regions"; glibc's malloc does not advise
unless its `glibc.malloc.hugetlb` tunable is set, libc-alpha, "malloc: Add madvise support for
Transparent Huge Pages", 2021-08). Torch allocates weights through that malloc, and the common
default (this machine too) is `madvise`. So the weights a step streams are copied into
one advised mapping. Measured: a one-rank, one-thread batch-1 decode step of SmolLM2 took
44.4 ms with the weights as loaded and 42.5 ms on huge pages (the same run, quiet machine).

Where transparent huge pages are `never` (or the platform has no madvise), the tensors stay where
they are (copied only if they do not start on a 64-byte boundary, see `aligned`): the only cost of
that is the speed.
"""

from __future__ import annotations

import mmap
from pathlib import Path

import torch

HUGE = 2 << 20  # x86-64 transparent huge page
# Every weight a product reads starts on a 64-byte boundary, whichever process or layout holds it.
# MKL may order a product's sums by where its operands start ("Array alignment can determine how
# internal loops order floating-point operations", Intel MKL User's Guide, "Aligning Data for
# Consistent Results"; oneMKL Developer Guide 2025.1, "Example of Data Alignment": reproducible
# results need arrays aligned on 64-byte boundaries). A tensor read from safetensors is a view into
# the mapped file at whatever offset the header left (SmolLM2's embedding: 8 bytes past a 64-byte
# boundary), and on an AMD EPYC MKL's one-row product over it summed in another order than over an
# aligned copy of it (logits ~5e-6 apart). torch's own allocations start on 64 bytes (pytorch
# c10/core/alignment.h, gAlignment = 64), so an aligned copy is one torch allocation.
ALIGN_BYTES = 64
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def available() -> bool:
    """True when an advised mapping can get huge pages here."""
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        setting = THP_SETTING.read_text()
    except OSError:
        return False
    return "[never]" not in setting


def aligned(t: torch.Tensor) -> torch.Tensor:
    """t when it is contiguous and starts on an ALIGN_BYTES boundary, else a contiguous copy that does."""
    if t.is_contiguous() and t.data_ptr() % ALIGN_BYTES == 0:
        return t
    copy = t.clone(memory_format=torch.contiguous_format)
    assert copy.data_ptr() % ALIGN_BYTES == 0, "torch's CPU allocator aligns to 64 bytes (c10 gAlignment)"
    return copy


def on_huge_pages(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Contiguous copies of CPU float tensors in one mapping advised MADV_HUGEPAGE (the mapping lives
    as long as any of them), in the same order, each starting on ALIGN_BYTES; where huge pages are
    not available or a tensor is not a plain CPU tensor, the tensors themselves (`aligned`)."""
    if not tensors or not available() or any(t.device.type != "cpu" or t.layout != torch.strided for t in tensors):
        return [aligned(t) if t.device.type == "cpu" and t.layout == torch.strided else t for t in tensors]
    sizes = [-(-t.numel() * t.element_size() // ALIGN_BYTES) * ALIGN_BYTES for t in tensors]
    total = sum(sizes)
    region = mmap.mmap(-1, total + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    region.madvise(mmap.MADV_HUGEPAGE)
    raw = torch.frombuffer(region, dtype=torch.uint8)  # holds a reference to the mapping
    start = (-raw.data_ptr()) % HUGE
    out, offset = [], start
    for t, size in zip(tensors, sizes):
        n = t.numel() * t.element_size()
        copy = raw[offset : offset + n].view(t.dtype).view(t.shape)
        copy.copy_(t)
        out.append(copy)
        offset += size
    return out
