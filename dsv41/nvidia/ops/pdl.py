"""Programmatic dependent launch between the step's kernels (GPU only).

A decode step is a chain of short dependent launches; with PDL each kernel is
launched while its predecessor drains, and waits (``griddepcontrol.wait``)
before its first read of anything a predecessor wrote. Every kernel of the
step calls ``pdl_prologue_tl`` first, so no write happens before the wait and
the chain computes exactly what it computes without PDL. Reads before the wait
are of weights only, which no kernel writes (a server that reloads weights
synchronises before its next step).

On by default for steps of up to ``PDL_MAX_TOKENS`` tokens (``DSV41_PDL`` = 1 / 0
forces it on / off at every M). H200, graph replay, session 6: tp 4, M = 1,
40.6 us with it against 42.9 without (tp 2: 55.7 against 55.9); at M = 2 it
cost 9.1 us (67.1 against 58.0) and at M = 16 4.5 us. Letting the next kernel launch only
after the MMA GEMMs' K loop instead of at their start (session 10, PDL on at every M) gave, tp
4, M = 2 / 8 / 16: 54.7 / 66.4 / 76.9 us (start: 65.2 / 73.5 / 85.7; PDL off: 56.3 / 64.4 /
73.2), tp 2, M = 2 / 16: 71.7 / 90.8 (PDL off: 68.3 / 90.0); not kept. Session 12: with the
CUDA-core GEMV at two tokens (``mx_gemm.GEMV_MAX_M``) and PDL, M = 2 took 41.6 us at tp 4 and
66.8 at tp 2, against 56.4 and 68.8 on the MMA loop without PDL.

Releasing the next launch only once a kernel's own inputs are read (one-token GEMMs,
attention, the combine; a release predicated on that data) so the next GEMM's weights stream
after those reads, not beside them, was slower (session 18, tp 4, M = 1: 28.7 to 31.2 us
against 25.5 / 25.6 releasing at the start); removed.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from dsv41.common.platform import current_platform
from dsv41.common.switches import env_flag

PDL_MAX_TOKENS = 2


def pdl_enabled(tokens: int) -> bool:
    """Whether a launch for ``tokens`` tokens uses PDL: ``DSV41_PDL`` when set (1 or 0), else
    ``tokens <= PDL_MAX_TOKENS``; only where the platform has it (NVIDIA SM90+, compiled: no
    grid dependency control on ROCm or under the interpreter)."""
    forced = env_flag("DSV41_PDL", None)
    if not current_platform().pdl:
        return False
    return tokens <= PDL_MAX_TOKENS if forced is None else forced


def pdl_launch_options(on: bool) -> dict:
    """Extra launch keywords: ``launch_pdl=True`` when ``on``, nothing otherwise."""
    return {"launch_pdl": True} if on else {}


@triton.jit
def pdl_prologue_tl(USE_PDL: tl.constexpr):
    """Let the next kernel launch, then wait for the previous one's writes."""
    if USE_PDL:
        gdc_launch_dependents()
        gdc_wait()
