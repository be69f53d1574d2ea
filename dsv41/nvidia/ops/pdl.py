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

import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from dsv41.common.switches import env_flag

PDL_MAX_TOKENS = 2


def pdl_enabled(tokens: int) -> bool:
    """Whether a launch for ``tokens`` tokens uses PDL: ``DSV41_PDL`` when set (1 or 0), else
    ``tokens <= PDL_MAX_TOKENS``; never under the interpreter (no grid dependency control)."""
    forced = env_flag("DSV41_PDL", None)
    if os.environ.get("TRITON_INTERPRET") == "1":
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


# -- flag hand-offs ------------------------------------------------------------------
#
# Between two PDL launches a consumer's programs may, instead of ``griddepcontrol.wait``, spin
# on a word its producer's programs count themselves on once their stores are done (a CTA
# barrier, then one release atomic a program): the wait then ends when the last producer's
# stores are visible, not when the producer grid has drained. The consumer launches only after
# every producer program started (they let it launch first thing), so the producers are all
# resident while it spins: no deadlock. A hand-off's words (int32): arrivals, consumers past
# the spin, timeouts. The last consumer past the spin puts the first two back to 0, so the
# words serve every step and CUDA-graph replay with no memset; a consumer still ends with
# ``griddepcontrol.wait`` (its producer has drained by then), so a launch's completion still
# implies its predecessors'. A spin is bounded: past ``HANDOFF_SPINS`` polls the program counts
# a timeout and traps (a CUDA error, never a silent hang or a silently wrong step).

HANDOFF_WORDS = 4  # arrivals, passed, timeouts, (padding)
HANDOFF_SPINS = tl.constexpr(1 << 24)  # polls before a spin gives up


def handoffs_enabled() -> bool:
    """Whether the step's one- and two-token PDL edges hand off through flags: ``DSV41_HANDOFF``
    (1 or 0), off by default (GPU only: the interpreter has no concurrent programs)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return False
    return bool(env_flag("DSV41_HANDOFF", False))


class Handoff:
    """One PDL edge's flag words (int32 ``[HANDOFF_WORDS]`` zeros on the device) and the program
    count of the launch that arrives on them, which that launch records (``arrived_by``) before
    the consumer's launch reads it (``producers``)."""

    def __init__(self, words: torch.Tensor):
        if words.dtype != torch.int32 or tuple(words.shape) != (HANDOFF_WORDS,):
            raise ValueError(
                f"words: expected int32 [{HANDOFF_WORDS}], got {words.dtype} {list(words.shape)}"
            )
        self.words = words
        self._producers = 0

    def arrived_by(self, programs: int) -> None:
        """The producer launch of ``programs`` programs was enqueued with these words."""
        self._producers = programs

    @property
    def producers(self) -> int:
        if self._producers <= 0:
            raise RuntimeError("handoff: no producer launch was enqueued on these words yet")
        return self._producers


def handoff_args(arrive: Handoff | None, wait: Handoff | None, programs: int) -> dict:
    """The kernel arguments of a launch of ``programs`` programs that arrives on ``arrive`` and
    waits on ``wait`` (either None: that side is PDL's); records the arrival."""
    args = {}
    if arrive is not None:
        arrive.arrived_by(programs)
        args.update(ho_arrive_ptr=arrive.words, HO_ARRIVE=True)
    if wait is not None:
        args.update(ho_wait_ptr=wait.words, ho_producers=wait.producers, ho_programs=programs,
                    HO_WAIT=True)  # fmt: skip
    return args


@triton.jit
def _poll_tl(ptr):
    """``*ptr`` (int32) by a gpu-scope acquire load in the CTA's first warp; ``2^31 - 1`` in
    the others (they wait at the barrier after the spin): one poller a program, not one a warp,
    so the producers' arrivals do not queue behind the polls at the word's L2 slice."""
    return tl.inline_asm_elementwise(
        "{ .reg .pred first; .reg .u32 tid;\n"
        "mov.u32 tid, %tid.x;\n"
        "setp.lt.u32 first, tid, 32;\n"
        "mov.u32 $0, 2147483647;\n"
        "@first ld.acquire.gpu.global.b32 $0, [$1]; }",
        "=r,l", [ptr], dtype=tl.int32, is_pure=False, pack=1,
    )  # fmt: skip


@triton.jit
def _trap_tl(v):
    """Abort the launch (a CUDA error reaches the host); returns ``v``."""
    return tl.inline_asm_elementwise("mov.b32 $0, $1; trap;", "=r,r", [v], dtype=tl.int32,
                                     is_pure=False, pack=1)  # fmt: skip


@triton.jit
def handoff_wait_tl(USE_PDL: tl.constexpr, HO_WAIT: tl.constexpr, words_ptr, producers):
    """The prologue's wait: ``pdl_prologue_tl``, or with ``HO_WAIT`` let the next kernel launch
    and spin until ``producers`` programs arrived on ``words_ptr`` (acquire)."""
    if HO_WAIT:
        gdc_launch_dependents()
        seen = _poll_tl(words_ptr)
        polls = 0
        while (seen < producers) & (polls < HANDOFF_SPINS):
            seen = _poll_tl(words_ptr)
            polls += 1
        if seen < producers:
            tl.atomic_add(words_ptr + 2, 1, sem="relaxed", scope="gpu")
            _trap_tl(seen)
        tl.debug_barrier()
    else:
        pdl_prologue_tl(USE_PDL)


@triton.jit
def handoff_arrive_tl(HO_ARRIVE: tl.constexpr, words_ptr):
    """After this program's last store of what the next kernel reads: count it (release)."""
    if HO_ARRIVE:
        tl.debug_barrier()
        tl.atomic_add(words_ptr, 1, sem="release", scope="gpu")


@triton.jit
def handoff_done_tl(HO_WAIT: tl.constexpr, words_ptr, programs):
    """A consumer's end: count it past the spin (the last resets the words), then wait for the
    producer grid's completion (it has drained by now)."""
    if HO_WAIT:
        passed = tl.atomic_add(words_ptr + 1, 1, sem="relaxed", scope="gpu")
        if passed == programs - 1:
            tl.atomic_xchg(words_ptr, 0, sem="relaxed", scope="gpu")
            tl.atomic_xchg(words_ptr + 1, 0, sem="relaxed", scope="gpu")
        gdc_wait()
