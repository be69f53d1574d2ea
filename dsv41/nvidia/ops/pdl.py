"""Programmatic dependent launch between the step's kernels (GPU only).

A decode step is a chain of short dependent launches; with PDL each kernel is
launched while its predecessor drains, and waits (``griddepcontrol.wait``)
before its first read of anything a predecessor wrote. Every kernel of the
step calls ``pdl_prologue_tl`` first, so no write happens before the wait and
the chain computes exactly what it computes without PDL. Reads before the wait
are of weights only, which no kernel writes (a server that reloads weights
synchronises before its next step).

On by default for steps of up to ``PDL_MAX_TOKENS`` tokens (``DSV41_PDL`` = 1 / 0
forces it on / off at every M), where every GEMM reads its weights before the wait: the
CUDA-core loop (``mx_gemm.GEMV_MAX_M``; tp 4, M = 2: 41.6 against 56.4 us on the H200) and
the MMA loop of one K step a program (``mx_gemm.PRELOAD_MAX_M``, where its grids fit one wave;
H100, tp 4, M = 4: 3.57x the floor against 4.31x). With the pipelined MMA loop, which reads
after the wait, it cost 1 to 9 us, so there it stays off.
Each kernel releases its dependents at its start (a later release measured slower).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from dsv41.common import switches
from dsv41.common.platform import current_platform

PDL_MAX_TOKENS = 8


def pdl_enabled(tokens: int, weights_first: bool = True) -> bool:
    """Whether a launch for ``tokens`` tokens uses PDL: ``DSV41_PDL`` when set (1 or 0), else
    ``tokens <= PDL_MAX_TOKENS`` where ``weights_first`` (the GEMMs read their weights before
    the wait); only where the platform has it (NVIDIA SM90+, compiled: no grid dependency
    control on ROCm or under the interpreter)."""
    forced = switches.pdl()
    if not current_platform().pdl:
        return False
    return tokens <= PDL_MAX_TOKENS and weights_first if forced is None else forced


def pdl_launch_options(on: bool) -> dict:
    """Extra launch keywords: ``launch_pdl=True`` when ``on``, nothing otherwise."""
    return {"launch_pdl": True} if on else {}


@triton.jit
def pdl_prologue_tl(USE_PDL: tl.constexpr):
    """Let the next kernel launch, then wait for the previous one's writes."""
    if USE_PDL:
        gdc_launch_dependents()
        gdc_wait()
