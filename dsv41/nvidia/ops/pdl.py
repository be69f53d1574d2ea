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

``DSV41_PDL_LATE`` (session 17, prepared, not yet timed) moves the release of one-token
GEMMs, attention and the combine from their start to after their own inputs are read
(``pdl_late``, ``pdl_release_tl``), so the next kernel's weight loads do not stream beside
those reads.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from dsv41.common.switches import env_flag, env_int

PDL_MAX_TOKENS = 2
# Kinds of kernel ``DSV41_PDL_LATE`` (a sum of these bits) makes release their dependents late.
LATE_GEMV = 1  # a one-token CUDA-core GEMM: once its activation is read and cast
LATE_ATTENTION = 2  # attention: once its first key block is in the online softmax
LATE_COMBINE = 4  # the attention combine: once every split's partials are summed
# The release itself: predicated on a value of the data it waits for (true unless that value's
# bits are one particular NaN, where the program releases at its exit instead), so it cannot
# issue before the data arrives.
_RELEASE_AFTER = tl.constexpr(
    "{ .reg .pred p; setp.ne.b32 p, $1, 0x7fc0dead; @p griddepcontrol.launch_dependents; "
    "mov.b32 $0, 0; }"
)


def pdl_enabled(tokens: int) -> bool:
    """Whether a launch for ``tokens`` tokens uses PDL: ``DSV41_PDL`` when set (1 or 0), else
    ``tokens <= PDL_MAX_TOKENS``; never under the interpreter (no grid dependency control)."""
    forced = env_flag("DSV41_PDL", None)
    if os.environ.get("TRITON_INTERPRET") == "1":
        return False
    return tokens <= PDL_MAX_TOKENS if forced is None else forced


def pdl_late(kind: int) -> bool:
    """Whether kernels of ``kind`` (``LATE_GEMV``, ``LATE_ATTENTION``, ``LATE_COMBINE``) let
    their dependents launch only once their own inputs are read (``pdl_release_tl``) instead of
    at their start: ``DSV41_PDL_LATE`` (a sum of those bits, 0 .. 7) when set, else none. The
    next kernel's weight loads then stream from HBM after this kernel's reads, not beside them."""
    return bool(env_int("DSV41_PDL_LATE", 0, lambda v: v <= 7, "0 .. 7") & kind)


def pdl_launch_options(on: bool) -> dict:
    """Extra launch keywords: ``launch_pdl=True`` when ``on``, nothing otherwise."""
    return {"launch_pdl": True} if on else {}


@triton.jit
def pdl_prologue_tl(USE_PDL: tl.constexpr, LATE: tl.constexpr = False):
    """Let the next kernel launch (with ``LATE``, ``pdl_release_tl`` does later), then wait for
    the previous one's writes."""
    if USE_PDL:
        if not LATE:
            gdc_launch_dependents()
        gdc_wait()


@triton.jit
def pdl_release_tl(USE_PDL: tl.constexpr, LATE: tl.constexpr, data):
    """With ``LATE``: let the next kernel launch once the fp32 tensor ``data`` is computed (each
    thread once its elements are; the first in a program releases it)."""
    if USE_PDL and LATE:
        tl.inline_asm_elementwise(_RELEASE_AFTER, "=r,r", [data.to(tl.int32, bitcast=True)],
                                  dtype=tl.int32, is_pure=False, pack=1)  # fmt: skip
