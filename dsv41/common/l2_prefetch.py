"""Asking the L2 for weights ahead of their reads (NVIDIA SM90 and later; a hint, never a result).

A decode step reads each weight once, in a few short kernels; a lone kernel
streaming a few MB ramps up too slowly to reach the copy bandwidth. A bulk L2
prefetch (``cp.async.bulk.prefetch.L2``, PTX ISA 8.0, SM90+) puts a whole
range in flight without holding a register or waiting for it, so the step's
weight streams can overlap.

- ``bulk_prefetch_l2_tl``: the instruction, per lane, predicated off for dead lanes.
- ``l2_prefetched(tensors)``: a context manager for a step's launches. On entry
  it forks a side stream, where one small kernel asks the L2 for every byte of
  ``tensors``; on exit the current stream joins it. The fork and join are
  plain stream waits, so a CUDA graph captures them. Off (a no-op) unless
  ``l2_prefetch_enabled``.

Prefetching only hints the cache: every kernel computes exactly what it
computes without it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence

import torch
import triton
import triton.language as tl

PREFETCH_UNIT = 16  # bytes: a bulk prefetch's size and address are multiples of this
CHUNK_BYTES = 16384  # bytes one lane asks for
LANES = 32  # lanes (prefetches) a program issues for one tensor


@triton.jit
def bulk_prefetch_l2_tl(addr, nbytes, live):
    """Ask the L2 for ``nbytes`` bytes at each lane's ``addr`` (int64) where ``live``; no wait.
    ``addr`` and ``nbytes`` are multiples of 16 where live."""
    tl.inline_asm_elementwise(
        "{\n\t.reg .pred p;\n\tsetp.ne.s32 p, $3, 0;\n\t"
        "@p cp.async.bulk.prefetch.L2.global [$1], $2;\n\t}\n\tmov.u32 $0, 0;",
        "=r,l,r,r",
        [addr, nbytes, live.to(tl.int32)],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def l2_prefetch_kernel(table_ptr, CHUNK: tl.constexpr, LANES: tl.constexpr):
    """Program (p, r) asks for chunks ``p * LANES ..`` of range r; ``table`` is int64 [R, 2]:
    (address, bytes), both multiples of 16."""
    p = tl.program_id(0)
    r = tl.program_id(1)
    base = tl.load(table_ptr + 2 * r)
    nbytes = tl.load(table_ptr + 2 * r + 1)
    first = p.to(tl.int64) * (LANES * CHUNK)
    if first < nbytes:
        off = first + tl.arange(0, LANES).to(tl.int64) * CHUNK
        size = tl.minimum(nbytes - off, CHUNK)
        live = size > 0
        bulk_prefetch_l2_tl(base + off, tl.where(live, size, 16).to(tl.int32), live)


def l2_prefetch_enabled(device: torch.device) -> bool:
    """``DSV41_L2_PREFETCH`` (``0`` off, ``1`` on; default on), on a CUDA GPU of SM90 or later,
    not under the Triton interpreter and not on ROCm (the instruction is NVIDIA PTX)."""
    return (
        os.environ.get("DSV41_L2_PREFETCH", "1") == "1"
        and os.environ.get("TRITON_INTERPRET") != "1"
        and device.type == "cuda"
        and torch.version.hip is None
        and torch.cuda.get_device_capability(device)[0] >= 9
    )


def prefetch_table(tensors: Sequence[torch.Tensor]) -> list[tuple[int, int]]:
    """``(address, bytes)`` of each tensor, the bytes rounded down to whole 16-byte units.

    Raises ``ValueError`` naming a tensor that is not contiguous or not 16-byte aligned
    (a bulk prefetch of a strided view would fetch the wrong bytes)."""
    table = []
    for i, t in enumerate(tensors):
        if not t.is_contiguous():
            raise ValueError(f"tensors[{i}]: expected a contiguous tensor, got strides {t.stride()}")
        if t.data_ptr() % PREFETCH_UNIT:
            raise ValueError(
                f"tensors[{i}]: expected a 16-byte aligned address, got {t.data_ptr():#x}"
            )
        nbytes = t.numel() * t.element_size() // PREFETCH_UNIT * PREFETCH_UNIT
        if nbytes:
            table.append((t.data_ptr(), nbytes))
    return table


_TABLES: dict[tuple, torch.Tensor] = {}
_SIDE_STREAMS: dict[int, torch.cuda.Stream] = {}


def _device_table(table: list[tuple[int, int]], device: torch.device) -> torch.Tensor:
    """The table as a device tensor, kept for the process: a captured graph reads it by address."""
    key = (device.index, tuple(table))
    if key not in _TABLES:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                "l2_prefetched: these weights were never prefetched outside a graph capture; "
                "run one step eagerly before capturing (as for compiling the kernels)"
            )
        _TABLES[key] = torch.tensor(table, dtype=torch.int64, device=device)
    return _TABLES[key]


@contextlib.contextmanager
def l2_prefetched(tensors: Sequence[torch.Tensor]) -> Iterator[None]:
    """Launches inside run while a side stream asks the L2 for ``tensors`` (see the module)."""
    device = tensors[0].device
    if not l2_prefetch_enabled(device):
        yield
        return
    table = prefetch_table(tensors)
    rows = _device_table(table, device)
    programs = triton.cdiv(max(n for _, n in table), CHUNK_BYTES * LANES)
    main = torch.cuda.current_stream(device)
    side = _SIDE_STREAMS.setdefault(device.index, torch.cuda.Stream(device))
    side.wait_stream(main)
    with torch.cuda.stream(side):
        l2_prefetch_kernel[(programs, len(table))](rows, CHUNK=CHUNK_BYTES, LANES=LANES, num_warps=1)
    try:
        yield
    finally:
        main.wait_stream(side)
