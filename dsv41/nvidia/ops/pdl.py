"""Programmatic dependent launch between the step's kernels (opt-in: ``DSV41_PDL=1``, GPU only).

A decode step is a chain of short dependent launches; with PDL each kernel is
launched while its predecessor drains, and waits (``griddepcontrol.wait``)
before its first read of anything a predecessor wrote. Every kernel of the
step calls ``pdl_prologue_tl`` first, so no write happens before the wait and
the chain computes exactly what it computes without PDL.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


def pdl_enabled() -> bool:
    """``DSV41_PDL=1`` and not the interpreter (which has no grid dependency control)."""
    return os.environ.get("DSV41_PDL") == "1" and os.environ.get("TRITON_INTERPRET") != "1"


def pdl_launch_options() -> dict:
    """Extra launch keywords: ``launch_pdl=True`` when PDL is on, nothing otherwise."""
    return {"launch_pdl": True} if pdl_enabled() else {}


@triton.jit
def pdl_prologue_tl(USE_PDL: tl.constexpr):
    """Let the next kernel launch, then wait for the previous one's writes."""
    if USE_PDL:
        gdc_launch_dependents()
        gdc_wait()
