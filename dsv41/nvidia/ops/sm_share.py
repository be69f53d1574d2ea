"""Launches whose programs hold a SM alone (GPU only).

At one token attention's programs, bound by the latency of their instructions and L2 reads,
shared their SMs with the programs of wo_a and the combine that PDL launches early: wo_a's
stream their weights from HBM while they wait. A program that asks for all of a SM's shared
memory leaves no room there for any other program that uses shared memory (every GEMM,
attention and combine program does), so it runs alone on its SM.

Triton sizes a kernel's dynamic shared memory from what the kernel uses; ``reserve_shared``
raises that size on the compiled kernel (Triton's ``CompiledKernel``: its metadata and the
packed launch metadata) before a launch, so its module is loaded again with the larger size at
that launch (a server's warm-up step runs each variant before it captures a graph, so no module
is loaded while a graph is captured). The kernel reads and writes no more than it did: the
rest is only held.
"""

from __future__ import annotations

import functools
import warnings

import torch
import triton

SM_BLOCK_RESERVE = 1024  # shared bytes the hardware keeps for each resident program (SM90)


@functools.cache
def whole_sm_shared_bytes(index: int) -> int:
    """Shared memory a program asks for so that no other program using shared memory fits
    beside it on a SM of CUDA device ``index``: the SM's shared memory less its own reserve,
    capped at what one program may ask for."""
    per_sm = torch.cuda.get_device_properties(index).shared_memory_per_multiprocessor
    per_program = triton.runtime.driver.active.utils.get_device_properties(index)[
        "max_shared_mem"
    ]
    return min(per_program, per_sm - SM_BLOCK_RESERVE)


def reserve_shared(compiled, nbytes: int) -> None:
    """Make the compiled Triton kernel ``compiled`` launch with at least ``nbytes`` of dynamic
    shared memory (its module loaded again with the new size at its next launch)."""
    if compiled.metadata.shared >= nbytes:
        return
    if not hasattr(compiled, "packed_metadata") or len(compiled.packed_metadata) != 3:
        raise RuntimeError(
            "sm_share.reserve_shared: expected a Triton CompiledKernel whose packed_metadata is "
            f"(num_warps, num_ctas, shared), got {getattr(compiled, 'packed_metadata', None)!r}"
        )
    compiled.metadata = compiled.metadata._replace(shared=nbytes)
    compiled.packed_metadata = (*compiled.packed_metadata[:2], nbytes)
    compiled.module = compiled.function = compiled._run = None  # loaded again at its launch


def launch_alone(kernel, grid, alone: bool, device: torch.device, *args, **kwargs) -> None:
    """``kernel[grid](*args, **kwargs)`` on ``device``; with ``alone`` each program holds a
    whole SM's shared memory (``whole_sm_shared_bytes``), where this Triton's launcher lets
    it (else a warning, and the programs share their SMs: the same results)."""
    if alone:
        compiled = kernel.warmup(*args, grid=grid, **kwargs)  # compiled, not launched
        index = device.index if device.index is not None else torch.cuda.current_device()
        try:
            reserve_shared(compiled, whole_sm_shared_bytes(index))
        except RuntimeError as e:
            warnings.warn(f"{e}: launching without holding SMs alone", stacklevel=2)
    kernel[grid](*args, **kwargs)
