"""Launches whose programs keep a SM's shared memory to themselves (GPU only).

At one token attention and its combine are bound by the latency of their L2 reads (q, the
splits' partials: 1.5 and 2.3 us past their waits on the H200), while the programs of wo_a
and wo_b, launched early by PDL, stream their weights from HBM on the same SMs. A program that
asks for ``1 / per_sm`` of a SM's shared memory leaves no room there for any other program
that uses shared memory (every GEMM and attention program does), so at most ``per_sm`` of it
share a SM and no weight stream queues beside its reads.

Triton sizes a kernel's dynamic shared memory from what the kernel uses; ``reserve_shared``
raises that size on the compiled kernel before its first launch (its module is loaded again
with the larger size). The kernel reads no more than it did: the rest is only held.
"""

from __future__ import annotations

import torch
import triton

from dsv41.common.switches import env_int

SM_BLOCK_RESERVE = 1024  # bytes the hardware keeps for each resident program (SM90)


def sm_share(name: str) -> int:
    """``DSV41_<name>_PER_SM``: 0 (off, the default) or the most programs of that launch a SM
    may hold (1 .. 8), no other program beside them."""
    var = f"DSV41_{name}_PER_SM"
    return env_int(var, 0, lambda v: 0 <= v <= 8, "0 (off) or 1 .. 8")


def shared_bytes_for(per_sm: int, device: torch.device) -> int:
    """Shared memory a program asks for so that no more than ``per_sm`` programs of any kernel
    that uses shared memory fit on a SM of ``device``."""
    props = torch.cuda.get_device_properties(device)
    per_block = triton.runtime.driver.active.utils.get_device_properties(device.index or 0)[
        "max_shared_mem"
    ]
    per_sm_bytes = props.shared_memory_per_multiprocessor
    return min(per_block, per_sm_bytes // per_sm - SM_BLOCK_RESERVE)


def reserve_shared(compiled, nbytes: int) -> None:
    """Make the compiled Triton kernel ``compiled`` launch with at least ``nbytes`` of dynamic
    shared memory (its module reloaded once with the new size)."""
    if compiled.metadata.shared >= nbytes:
        return
    compiled.metadata = compiled.metadata._replace(shared=nbytes)
    compiled.packed_metadata = (*compiled.packed_metadata[:2], nbytes)
    compiled.module = compiled.function = compiled._run = None  # loaded again at the launch


def launch_alone(kernel, grid, per_sm: int, *args, **kwargs) -> None:
    """``kernel[grid](*args, **kwargs)``, its programs holding ``1 / per_sm`` of a SM's shared
    memory each where ``per_sm`` > 0 (``sm_share``)."""
    if per_sm:
        compiled = kernel.warmup(*args, grid=grid, **kwargs)
        device = torch.device("cuda", torch.cuda.current_device())
        reserve_shared(compiled, shared_bytes_for(per_sm, device))
    kernel[grid](*args, **kwargs)
