"""Launches whose programs hold a SM alone (GPU only).

At one token attention's programs, bound by the latency of their instructions and L2 reads,
shared their SMs with the programs of wo_a and the combine that PDL launches early: wo_a's
stream their weights from HBM while they wait. A program that asks for all of a SM's shared
memory leaves no room there for any other program that uses shared memory (every GEMM,
attention and combine program does), so it runs alone on its SM.

Triton sizes a kernel's dynamic shared memory from what the kernel uses; ``reserve_shared``
raises that size on the compiled kernel before its first launch (its module is loaded again
with the larger size). The kernel reads and writes no more than it did: the rest is only held.
"""

from __future__ import annotations

import torch
import triton

SM_BLOCK_RESERVE = 1024  # shared bytes the hardware keeps for each resident program (SM90)


def whole_sm_shared_bytes(device: torch.device) -> int:
    """Shared memory a program asks for so that no other program using shared memory fits
    beside it on a SM of ``device``: the SM's shared memory less its own reserve, capped at
    what one program may ask for."""
    per_sm = torch.cuda.get_device_properties(device).shared_memory_per_multiprocessor
    index = device.index if device.index is not None else torch.cuda.current_device()
    per_program = triton.runtime.driver.active.utils.get_device_properties(index)[
        "max_shared_mem"
    ]
    return min(per_program, per_sm - SM_BLOCK_RESERVE)


def reserve_shared(compiled, nbytes: int) -> None:
    """Make the compiled Triton kernel ``compiled`` launch with at least ``nbytes`` of dynamic
    shared memory (its module loaded again with the new size at its next launch)."""
    if compiled.metadata.shared >= nbytes:
        return
    compiled.metadata = compiled.metadata._replace(shared=nbytes)
    compiled.packed_metadata = (*compiled.packed_metadata[:2], nbytes)
    compiled.module = compiled.function = compiled._run = None


def launch_alone(kernel, grid, alone: bool, device: torch.device, *args, **kwargs) -> None:
    """``kernel[grid](*args, **kwargs)`` on ``device``; with ``alone`` each program holds a
    whole SM's shared memory (``whole_sm_shared_bytes``)."""
    if alone:
        compiled = kernel.warmup(*args, grid=grid, **kwargs)
        reserve_shared(compiled, whole_sm_shared_bytes(device))
    kernel[grid](*args, **kwargs)
