"""Weights into L2 ahead of the stages that read them (NVIDIA SM90 and later; GPU only).

A decode step is a chain of short stages, each too short to keep HBM busy: while
Wqkv streams its 9 MB, the bytes of wq_b, wo_a and wo_b (about 30 MB at tp 4)
wait. A bulk L2 prefetch (``cp.async.bulk.prefetch.L2.global``, PTX 8.0, SM90:
one instruction asks the memory system for up to ``PREFETCH_CHUNK`` bytes and
returns nothing to the SM) issued at the start of the step asks for them all, in
the order the step reads them, so the later stages find their weights in L2.
Every byte still comes from HBM once a step; only the time of its read moves.

At most ``PREFETCH_L2_SHARE`` of the L2 is asked for, so the last chunks asked
for do not evict the first before they are read (tp 2's 60 MB would). A prefetch
changes no value: the interpreter (no inline PTX) and CPU tensors skip it, and
``DSV41_L2_PREFETCH`` = 0 / 1 turns it off / on (default ``L2_PREFETCH_DEFAULT``).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from dsv41.common.switches import env_flag

PREFETCH_CHUNK = 16384  # bytes one bulk prefetch asks for
PREFETCH_ALIGN = 16  # a bulk prefetch's address and size are multiples of 16 bytes
PREFETCH_L2_SHARE = 0.6  # of the device's L2: the most a step asks for
MAX_REGIONS = 6  # the (address, bytes) pairs l2_prefetch_tl takes
L2_PREFETCH_DEFAULT = True


def l2_prefetch_enabled(device: torch.device) -> bool:
    """Whether to prefetch for a step on ``device``: a CUDA GPU of SM90 or later, not the
    interpreter, and ``DSV41_L2_PREFETCH`` (1 or 0) when set, else ``L2_PREFETCH_DEFAULT``."""
    on = env_flag("DSV41_L2_PREFETCH", L2_PREFETCH_DEFAULT)
    if not on or device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    return torch.version.hip is None and torch.cuda.get_device_capability(device)[0] >= 9


def prefetch_regions(tensors: list[torch.Tensor], budget: int) -> list[tuple[int, int]]:
    """``(address, bytes)`` of each tensor's storage in order, trimmed inwards to 16-B
    boundaries (at most 15 bytes at each end go unasked), the last one cut so that the
    total is at most ``budget`` bytes; empty regions dropped. Tensors must be contiguous."""
    if len(tensors) > MAX_REGIONS:
        raise ValueError(f"tensors: expected at most {MAX_REGIONS}, got {len(tensors)}")
    regions, left = [], budget
    for i, t in enumerate(tensors):
        if not t.is_contiguous():
            raise ValueError(f"tensors[{i}]: expected contiguous, got strides {t.stride()}")
        start = t.data_ptr()
        end = start + t.numel() * t.element_size()
        first = -(-start // PREFETCH_ALIGN) * PREFETCH_ALIGN
        last = end // PREFETCH_ALIGN * PREFETCH_ALIGN
        size = min(last - first, left // PREFETCH_ALIGN * PREFETCH_ALIGN)
        if size > 0:
            regions.append((first, size))
            left -= size
    return regions


def prefetch_args(tensors: list[torch.Tensor]) -> list[int] | None:
    """The 12 scalar arguments of ``l2_prefetch_tl`` for these tensors on their device (regions
    past the last have 0 bytes), or None where no prefetch is to run (``l2_prefetch_enabled``)."""
    device = tensors[0].device
    if not l2_prefetch_enabled(device):
        return None
    budget = int(torch.cuda.get_device_properties(device).L2_cache_size * PREFETCH_L2_SHARE)
    flat = [v for region in prefetch_regions(tensors, budget) for v in region]
    return flat + [0] * (2 * MAX_REGIONS - len(flat))


def prefetch_chunks(args: list[int]) -> int:
    """Bulk prefetches ``l2_prefetch_tl`` issues for ``prefetch_args``' regions."""
    return sum(-(-n // PREFETCH_CHUNK) for n in args[1::2])


@triton.jit
def _region_tl(g, start, a, n, addr, size, CHUNK: tl.constexpr):
    """Chunk ``g - start`` of the region of ``n`` bytes at address ``a`` where ``g`` falls in
    it: ``(addr, size)`` updated, and the next region's first chunk."""
    chunks = (n + CHUNK - 1) // CHUNK
    mine = (g >= start) & (g < start + chunks)
    off = (g - start).to(tl.int64) * CHUNK
    addr = tl.where(mine, a + off, addr)
    size = tl.where(mine, tl.minimum(n - off, CHUNK), size)
    return addr, size, start + chunks


@triton.jit
def l2_prefetch_tl(g, a0, n0, a1, n1, a2, n2, a3, n3, a4, n4, a5, n5, CHUNK: tl.constexpr):
    """One bulk L2 prefetch a lane: chunk ``g`` (int32 tensor) of the regions laid end to end
    (address ``a``, bytes ``n``, multiples of 16; a lane past the last chunk asks nothing)."""
    addr = tl.zeros(g.shape, tl.int64)
    size = tl.zeros(g.shape, tl.int64)
    addr, size, start = _region_tl(g, 0, a0, n0, addr, size, CHUNK)
    addr, size, start = _region_tl(g, start, a1, n1, addr, size, CHUNK)
    addr, size, start = _region_tl(g, start, a2, n2, addr, size, CHUNK)
    addr, size, start = _region_tl(g, start, a3, n3, addr, size, CHUNK)
    addr, size, start = _region_tl(g, start, a4, n4, addr, size, CHUNK)
    addr, size, start = _region_tl(g, start, a5, n5, addr, size, CHUNK)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.gt.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; "
        "mov.b32 $0, 0; }",
        "=r,l,r",
        [addr, size.to(tl.int32)],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )
