"""The nvidia step's L2 prefetch launch (``dsv41.common.l2_prefetch`` says what and why).

One small kernel on a side stream forked at the step's start: one lane a chunk,
``PREFETCH_LANES`` lanes a program; it ends as soon as its prefetches are issued.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41.common.l2_prefetch import PREFETCH_CHUNK, l2_prefetch_tl, prefetch_args, prefetch_chunks

PREFETCH_LANES = 128  # chunks a program asks for: one thread each

_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


@triton.jit(
    do_not_specialize=["a0", "n0", "a1", "n1", "a2", "n2", "a3", "n3", "a4", "n4", "a5", "n5"]
)
def l2_prefetch_kernel(
    a0, n0, a1, n1, a2, n2, a3, n3, a4, n4, a5, n5,
    CHUNK: tl.constexpr, LANES: tl.constexpr,
):  # fmt: skip
    """Chunks ``pid * LANES ..`` of the regions (``l2_prefetch_tl``)."""
    g = tl.program_id(0) * LANES + tl.arange(0, LANES)
    l2_prefetch_tl(g, a0, n0, a1, n1, a2, n2, a3, n3, a4, n4, a5, n5, CHUNK)


def launch_l2_prefetch(tensors: list[torch.Tensor]) -> torch.cuda.Stream | None:
    """Enqueue bulk L2 prefetches of ``tensors`` (in order) on a side stream forked from the
    current one; returns that stream, which the caller joins before its step ends (a CUDA
    graph capture needs every forked stream joined), or None where nothing was launched
    (``l2_prefetch_enabled``)."""
    args = prefetch_args(tensors)
    if args is None or prefetch_chunks(args) == 0:
        return None
    device = tensors[0].device
    if device not in _STREAMS:
        _STREAMS[device] = torch.cuda.Stream(device)
    side = _STREAMS[device]
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        programs = -(-prefetch_chunks(args) // PREFETCH_LANES)
        l2_prefetch_kernel[(programs,)](
            *args, CHUNK=PREFETCH_CHUNK, LANES=PREFETCH_LANES, num_warps=PREFETCH_LANES // 32
        )
    return side
