"""The GPU's global nanosecond timer inside a Triton kernel (NVIDIA PTX; not in the interpreter).

Used by timing probes and the mono kernel's opt-in task trace: values from
different SMs share one clock, so stamps of different programs compare.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def globaltimer_tl(like):
    """Nanoseconds of ``%globaltimer``, one int64 per lane of the int32 ``like``."""
    return tl.inline_asm_elementwise(
        "mov.u64 $0, %globaltimer;", "=l,r", [like], dtype=tl.int64, is_pure=False, pack=1
    )


@triton.jit
def clock64_tl(like):
    """The SM's cycle counter (``%clock64``), one int64 per lane of the int32 ``like``: stamps of
    one program (one SM) subtract to cycles, finer than ``%globaltimer``'s ticks."""
    return tl.inline_asm_elementwise(
        "mov.u64 $0, %clock64;", "=l,r", [like], dtype=tl.int64, is_pure=False, pack=1
    )


@triton.jit
def smid_tl(like):
    """The SM a program runs on (``%smid``), one int32 per lane of the int32 ``like``."""
    return tl.inline_asm_elementwise(
        "mov.u32 $0, %smid;", "=r,r", [like], dtype=tl.int32, is_pure=False, pack=1
    )
