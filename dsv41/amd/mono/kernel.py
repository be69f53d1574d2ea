"""The mono mega kernel: one persistent launch runs a layer step's task tables (docs/design.md §6).

Every program loops: take a ticket (``atomic_add`` on the ticket word), run the
task it names (the stage ranges come from ``Plan.stages``, the coordinates are
decoded as ``Plan.task_coords`` does), until the tickets run out or an error
is posted. A program's tickets only grow, so it runs a loop a stage, in stage order: what a
stage's code keeps in registers across its tasks (the lane-only shared-memory addresses of its
layout conversions, which LLVM hoists out of a loop) is live in that stage's loop only, not in
every stage's. The last program to finish resets the ticket and finished words and
advances the epoch, the tag of the next step's mailboxes. Hand-offs (module
docstring of ``plan.py``): a consumer spins on its mailbox's tag with acquire
atomics, at most ``spin_limit`` polls; on a timeout it posts ``ticket + 1`` to
the error word (first error wins), adds ``STOP_TICKETS`` to the ticket counter,
skips its task and stops; every program stops at its next ticket, which is past
the last task. A GEMV task does not poll the mailbox its program's previous
GEMV task already saw full (it stays full for the rest of the launch). A producer
publishes after a CTA barrier, with release atomics. Data produced inside the
launch is read with ``.cg`` loads, and only after every producer of each
128-B line it touches is done: a GEMV's 4-byte code loads may become
``cp.async.ca`` copies that fill L1 anyway (plan.py, "Cache lines").

A GEMV task loads its first two weight blocks (three on CUDA cores) before it waits on its
activations and keeps loading that many blocks ahead of its multiplies, so weight streaming
overlaps the hand-off latency. With
``GEMV_PAIRS`` a one-token wq_b or wo_b task takes its program's next ticket
before it starts and, when that is a task of the same stage, runs both as one
GEMV; else the program holds the ticket for its next turn. Holding keeps the
ticket order's guarantee: the smallest unfinished task is running, not merely
held (a held ticket's program runs a smaller task, which would be unfinished
too), and its waits point to finished tasks. MXFP8 operands
are dequantized exactly (e4m3 times a power of two fits bf16) and multiplied on
bf16 tensor cores with fp32 accumulation (with ``EXACT``, the interpreter, whose
bf16 ``tl.dot`` is broken, in fp32), or up to ``plan.CORES_TOKENS`` tokens on
CUDA cores. With ``A_DEQ`` (``Tuning.a_dequantized``, tensor cores) an activation is
dequantized once, by the task that makes it, into a bf16 region beside its MXFP8 form
(``plan.DEQUANTIZED``), and the tensor-core GEMV reads that instead of values and codes.
"""

from __future__ import annotations

import triton
import triton.language as tl

from dsv41.amd.mono.plan import (
    COMBINE_PARTS,
    CTL_EPOCH,
    CTL_ERROR,
    CTL_FINISHED,
    CTL_TICKET,
    WOA_TASK_ROWS,
    WOB_TASK_ROWS,
    WQB_TASK_ROWS,
    WQKV_TASK_ROWS,
)
from dsv41.common.fused_layout import Q_CHUNK
from dsv41.common.fused_layout_tl import q_tile_at_tl, q_tile_heads_tl
from dsv41.common.geometry import HEAD_TILE
from dsv41.common.kv_cache import KV_DIM
from dsv41.common.kv_records_tl import FMT_DS_MLA, decode_entries_tl, load_keys_tl, store_record_tl
from dsv41.common.mx import (
    MX_BLOCK,
    bf16_round_tl,
    e8m0_scale_tl,
    mx_dequantize_tl,
    mx_quantize_tl,
)
from dsv41.common.norm_tl import rms_factor_tl
from dsv41.common.rope import rope_pair_tl
from dsv41.common.timer_tl import globaltimer_tl

# The Python constants as constexpr globals, the only globals a jit function may read (a
# trailing underscore marks the twin of a Python constant of the same name).
MX: tl.constexpr = tl.constexpr(MX_BLOCK)  # 32 values share an E8M0 code
HEAD_DIM: tl.constexpr = tl.constexpr(KV_DIM)  # 512
HALF_DIM: tl.constexpr = tl.constexpr(KV_DIM // 2)  # GPT-J pairs of a head
HEAD_TILE_: tl.constexpr = tl.constexpr(HEAD_TILE)
HEADS_PER_GROUP: tl.constexpr = tl.constexpr(8)  # docs/design.md §1, checked by the config loader
Q_CHUNK_: tl.constexpr = tl.constexpr(Q_CHUNK)
WQKV_ROWS: tl.constexpr = tl.constexpr(WQKV_TASK_ROWS)
WQB_ROWS: tl.constexpr = tl.constexpr(WQB_TASK_ROWS)
WOA_ROWS: tl.constexpr = tl.constexpr(WOA_TASK_ROWS)
WOB_ROWS: tl.constexpr = tl.constexpr(WOB_TASK_ROWS)
COMBINE_PARTS_: tl.constexpr = tl.constexpr(COMBINE_PARTS)
CTL_TICKET_: tl.constexpr = tl.constexpr(CTL_TICKET)
CTL_FINISHED_: tl.constexpr = tl.constexpr(CTL_FINISHED)
CTL_EPOCH_: tl.constexpr = tl.constexpr(CTL_EPOCH)
CTL_ERROR_: tl.constexpr = tl.constexpr(CTL_ERROR)
STOP_TICKETS: tl.constexpr = tl.constexpr(1 << 30)  # added to the ticket on an error: past any task

# -- hand-offs -------------------------------------------------------------------


@triton.jit
def _wait(box_ptr, tag, spin_limit, ctl_ptr, ticket):
    """Spin until ``box.tag == tag`` (acquire), ``spin_limit`` polls at most; else post ticket+1
    to the error word and push the ticket counter past every task (no program starts another)."""
    got = tl.atomic_add(box_ptr + 1, 0, sem="acquire", scope="gpu")
    polls = 0
    while (got != tag) & (polls < spin_limit):
        got = tl.atomic_add(box_ptr + 1, 0, sem="acquire", scope="gpu")
        polls += 1
    ok = got == tag
    if got != tag:
        tl.atomic_cas(ctl_ptr + CTL_ERROR_, 0, ticket + 1, sem="relaxed", scope="gpu")
        tl.atomic_add(ctl_ptr + CTL_TICKET_, STOP_TICKETS, sem="relaxed", scope="gpu")
    tl.debug_barrier()
    return ok


@triton.jit
def _arrive(box_ptr, arrivals, tag, ok):
    """Count one arrival; the ``arrivals``-th resets the count and publishes ``tag`` (release).

    Returns whether this was the ``arrivals``-th (acq_rel: it has seen every earlier
    arrival's writes)."""
    tl.debug_barrier()
    last = ok
    if ok:
        old = tl.atomic_add(box_ptr, 1, sem="acq_rel", scope="gpu")
        last = old == arrivals - 1
        if last:
            tl.atomic_xchg(box_ptr, 0, sem="relaxed", scope="gpu")
            tl.atomic_xchg(box_ptr + 1, tag, sem="release", scope="gpu")
    return last


# -- arithmetic helpers -------------------------------------------------------------


@triton.jit
def _mma(a, b, acc, EXACT: tl.constexpr):
    """``acc + a @ b`` (fp32 accumulate): bf16 operands, or fp32 ones with ``EXACT``.

    On tensor cores a K block's products are summed from zero and added to ``acc``
    with an IEEE fp32 add, not chained through the MMA's accumulator, whose adds are
    not IEEE: a Wqkv K half chains 2560 products, and at the tp 2 share the kernel's
    q left the reference's (q 2.3e-4, y 1.3e-2 off at 20 tokens on the H200) while
    the schedule executor's fp32 sums of the same products give the reference's q.
    ``acc * 0.0`` is the zero: a constant zero would let Triton fold the add back into
    the MMA.
    """
    if EXACT:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return acc + tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), acc * 0.0)


@triton.jit
def _mma_split(a, w, acc3, SPLIT: tl.constexpr, EXACT: tl.constexpr):
    """``acc3 + a @ w^T`` per K segment: ``a [TB, BK]`` and ``w [ROWS, BK]`` cut along K into
    SPLIT segments, one batch of a batched dot each, ``acc3 [SPLIT, TB, ROWS]`` (sum it over
    axis 0 for the product). A small tile (16 x 16) has fewer MMA tiles than a program has
    warps: without the cut the warps repeat each other's dequantization and MMAs."""
    TB: tl.constexpr = a.shape[0]
    ROWS: tl.constexpr = w.shape[0]
    SEG: tl.constexpr = a.shape[1] // SPLIT
    a3 = tl.permute(tl.reshape(a, (TB, SPLIT, SEG)), (1, 0, 2))
    w3 = tl.permute(tl.reshape(w, (ROWS, SPLIT, SEG)), (1, 2, 0))
    return _mma(a3, w3, acc3, EXACT)


@triton.jit
def _mma_fp32_lhs(a, b, acc, EXACT: tl.constexpr):
    """``acc + a @ b`` for an fp32 ``a`` and a bf16-exact ``b``: ``a = hi + mid + lo`` in bf16.

    Three bf16 parts carry all 24 bits of an fp32 (each remainder is exact in fp32),
    so the products are exact. Two parts (16 bits) left a 2^-17 error in the attention
    output that the bf16 and MXFP8 roundings after it amplify: emulated at the flash
    geometry (tp 2, 20 tokens), y was 2.9e-3 off the reference with two parts, 2e-4
    with three.
    """
    if EXACT:
        return tl.dot(a, b.to(tl.float32), acc, input_precision="ieee")
    else:
        b16 = b.to(tl.bfloat16)
        hi = a.to(tl.bfloat16)
        rest = a - hi.to(tl.float32)
        mid = rest.to(tl.bfloat16)
        lo = (rest - mid.to(tl.float32)).to(tl.bfloat16)
        acc = tl.dot(hi, b16, acc)
        acc = tl.dot(mid, b16, acc)
        return tl.dot(lo, b16, acc)


@triton.jit
def _rope(
    v, cos_ptr, sin_ptr, rope_rows, pos, pair0, TABLE_W: tl.constexpr, ROWS: tl.constexpr,
    PAIRS: tl.constexpr, INVERSE: tl.constexpr,
):
    """fp32 ``v [ROWS, 2 PAIRS]`` (GPT-J pairs) turned at ``pos [ROWS]``: pair i by column pair0+i.

    ``cos`` / ``sin`` are fp32 ``[rope_rows, TABLE_W]`` (``TABLE_W = rope_dim / 2``).
    Pairs with a negative column are not rope dims: they get ``c = 1, s = 0``,
    which leaves them bit-exact; so does a position outside the tables (never read).
    """
    v0, v1 = tl.split(tl.reshape(v, (ROWS, PAIRS, 2)))
    pair = pair0 + tl.arange(0, PAIRS)
    turn = (pair >= 0)[None, :] & ((pos >= 0) & (pos < rope_rows))[:, None]
    at = pos[:, None].to(tl.int64) * TABLE_W + pair[None, :]
    c = tl.load(cos_ptr + at, mask=turn, other=1.0)
    s = tl.load(sin_ptr + at, mask=turn, other=0.0)
    r0, r1 = rope_pair_tl(v0, v1, c, s, INVERSE)
    return tl.reshape(tl.join(r0, r1), (ROWS, 2 * PAIRS))


@triton.jit
def _weight_block(w_ptr, ws_ptr, w_stride, ws_stride, k0, K: tl.constexpr, ROWS: tl.constexpr,
                  BK: tl.constexpr):
    """Weight block ``w[:ROWS, k0 : k0 + BK]`` (e4m3) and its codes; nothing is read past K
    (the columns there are 0)."""
    r = tl.arange(0, ROWS)
    k = k0 + tl.arange(0, BK)
    kc = k0 // MX + tl.arange(0, BK // MX)
    w = tl.load(w_ptr + r[:, None] * w_stride + k[None, :], mask=(k < K)[None, :], other=0.0,
                eviction_policy="evict_first")
    ws = tl.load(ws_ptr + r[:, None] * ws_stride + kc[None, :], mask=(kc < K // MX)[None, :],
                 other=0, eviction_policy="evict_first")
    return w, ws


@triton.jit
def _act_block(a_ptr, as_ptr, a_at, as_at, k0, K: tl.constexpr, BK: tl.constexpr):
    """One token row's MXFP8 activation block ``a[k0 : k0 + BK]`` as ``[BK / 32, 32]`` values
    and ``[BK / 32]`` codes (``.cg``: written in this launch); nothing past K is read. ``a_at``
    and ``as_at`` are the block's element and code offsets (``as_at`` = its MX block index)."""
    a8 = tl.load(a_ptr + k0 + a_at, mask=k0 + a_at < K, other=0.0, cache_modifier=".cg")
    a_s = tl.load(as_ptr + k0 // MX + as_at, mask=k0 // MX + as_at < K // MX, other=0,
                  cache_modifier=".cg")
    return a8, a_s


@triton.jit
def _weight_words(w_ptr, ws_ptr, rows, w_stride, ws_stride, k0, K: tl.constexpr,
                  BK: tl.constexpr):  # fmt: skip
    """``_weight_block`` of the weight rows ``rows`` (any rows, one stride) with the weights as
    int32 words ``[len(rows), BK / 4]``, four e4m3 values a word, the lowest byte first: a block
    in flight holds a register a word, not one a value."""
    c = k0 // 4 + tl.arange(0, BK // 4)
    kc = k0 // MX + tl.arange(0, BK // MX)
    words = w_ptr.to(tl.pointer_type(tl.int32))
    w = tl.load(words + rows[:, None] * (w_stride // 4) + c[None, :], mask=(c < K // 4)[None, :],
                other=0, eviction_policy="evict_first")
    ws = tl.load(ws_ptr + rows[:, None] * ws_stride + kc[None, :], mask=(kc < K // MX)[None, :],
                 other=0, eviction_policy="evict_first")
    return w, ws


@triton.jit
def _act_words(a_ptr, as_ptr, a_stride, S, k0, K: tl.constexpr, BK: tl.constexpr,
               TB: tl.constexpr):  # fmt: skip
    """Token rows ``0 .. TB``'s MXFP8 activation block ``a[:, k0 : k0 + BK]`` as int32 words
    ``[TB, BK / 4]`` and ``[TB, BK / 32]`` codes (``.cg``: written in this launch); rows past S
    and columns past K are not read (0)."""
    tok = tl.arange(0, TB)[:, None]
    live = tok < S
    if TB == 1:  # the one row is live
        live = tok == 0
    c = k0 // 4 + tl.arange(0, BK // 4)[None, :]
    kb = k0 // MX + tl.arange(0, BK // MX)[None, :]
    aw = tl.load(a_ptr.to(tl.pointer_type(tl.int32)) + tok * (a_stride // 4) + c,
                 mask=live & (c < K // 4), other=0, cache_modifier=".cg")  # fmt: skip
    a_s = tl.load(as_ptr + tok * (a_stride // MX) + kb, mask=live & (kb < K // MX), other=0,
                  cache_modifier=".cg")  # fmt: skip
    return aw, a_s


@triton.jit
def _e4m3_byte(w, SHIFT: tl.constexpr):
    """The e4m3 value in bits ``SHIFT .. SHIFT + 8`` of each int32 of ``w``, as fp32."""
    return ((w >> SHIFT) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)


@triton.jit
def _e4m3_words(w, PTX: tl.constexpr):
    """The four e4m3 values of each int32 word of ``w``, lowest byte first, as four fp32 tensors:
    with ``PTX`` two ``cvt.rn.f16x2.e4m3x2`` a word (NVIDIA), else byte by byte."""
    if PTX:
        return tl.inline_asm_elementwise(
            "{ .reg .b16 lo, hi, e0, e1, e2, e3; .reg .b32 h01, h23;\n"
            "mov.b32 {lo, hi}, $4;\n"
            "cvt.rn.f16x2.e4m3x2 h01, lo;\n"
            "cvt.rn.f16x2.e4m3x2 h23, hi;\n"
            "mov.b32 {e0, e1}, h01;\n"
            "mov.b32 {e2, e3}, h23;\n"
            "cvt.f32.f16 $0, e0; cvt.f32.f16 $1, e1; cvt.f32.f16 $2, e2; cvt.f32.f16 $3, e3; }",
            "=r,=r,=r,=r,r", [w], dtype=(tl.float32, tl.float32, tl.float32, tl.float32),
            is_pure=True, pack=1,
        )  # fmt: skip
    return _e4m3_byte(w, 0), _e4m3_byte(w, 8), _e4m3_byte(w, 16), _e4m3_byte(w, 24)


@triton.jit
def _per_word(v, ROWS: tl.constexpr, BLOCKS: tl.constexpr):
    """``v [ROWS, BLOCKS]`` (one per MX block) repeated for each of a block's 8 words."""
    return tl.reshape(tl.broadcast_to(v[:, :, None], (ROWS, BLOCKS, MX // 4)),
                      (ROWS, BLOCKS * MX // 4))


@triton.jit
def _by_token(v, TB: tl.constexpr):
    """A token's ``v [TB, words]`` as the lanes' ``[TB, 1, words]`` (one token: ``[1, words]``,
    the lanes staying ``[rows, words]``)."""
    if TB > 1:
        v = v[:, None, :]
    return v


@triton.jit
def _by_weight(v, TB: tl.constexpr):
    """A weight row's ``v [rows, words]`` as the lanes' ``[1, rows, words]`` (one token: as is)."""
    if TB > 1:
        v = v[None, :, :]
    return v


@triton.jit
def _gemv_words(a_ptr, as_ptr, a_stride, S, w_ptr, ws_ptr, rows, w_stride, ws_stride, box_ptr,
                seen, tag, spin_limit, ctl_ptr, ticket, TB: tl.constexpr, K: tl.constexpr,
                BK: tl.constexpr, PTX: tl.constexpr):  # fmt: skip
    """``_gemv`` of TB token rows (S live) on CUDA cores for the weight rows ``rows`` with the
    weights in flight as int32 words (``_weight_words``; 3 blocks ahead, the first 3 before the
    wait) and the activations one block ahead: each word's four products summed, times both
    scales, added to the (token, word) lane; the lanes summed once, after the loop. Returns
    ``(acc [TB, len(rows)], ok)``."""
    ROWS: tl.constexpr = rows.shape[0]
    BLOCKS: tl.constexpr = BK // MX
    w0, ws0 = _weight_words(w_ptr, ws_ptr, rows, w_stride, ws_stride, 0, K, BK)
    w1, ws1 = _weight_words(w_ptr, ws_ptr, rows, w_stride, ws_stride, BK, K, BK)
    w2, ws2 = _weight_words(w_ptr, ws_ptr, rows, w_stride, ws_stride, 2 * BK, K, BK)
    ok = ticket >= 0
    if box_ptr.to(tl.int64) != seen:
        ok = _wait(box_ptr, tag, spin_limit, ctl_ptr, ticket)
    aw, a_s = _act_words(a_ptr, as_ptr, a_stride, S, 0, K, BK, TB)
    lanes = tl.zeros((TB, ROWS, BK // 4) if TB > 1 else (ROWS, BK // 4), tl.float32)
    for k0 in range(0, K, BK):
        a_scale = _by_token(_per_word(e8m0_scale_tl(a_s.to(tl.int32)), TB, BLOCKS), TB)
        a0, a1, a2, a3 = _e4m3_words(_by_token(aw, TB), PTX)
        aw, a_s = _act_words(a_ptr, as_ptr, a_stride, S, k0 + BK, K, BK, TB)
        v0, v1, v2, v3 = _e4m3_words(_by_weight(w0, TB), PTX)
        w_scale = _by_weight(_per_word(e8m0_scale_tl(ws0.to(tl.int32)), ROWS, BLOCKS), TB)
        w0, ws0 = w1, ws1
        w1, ws1 = w2, ws2
        w2, ws2 = _weight_words(w_ptr, ws_ptr, rows, w_stride, ws_stride, k0 + 3 * BK, K, BK)
        lanes += (v0 * a0 + v1 * a1 + v2 * a2 + v3 * a3) * (w_scale * a_scale)
    if TB > 1:
        acc = tl.sum(lanes, axis=2)
    else:
        acc = tl.sum(lanes, axis=1)[None, :]
    return acc, ok


@triton.jit
def _gemv_pair(a_ptr, as_ptr, w_ptr, ws_ptr, row_a, row_b, w_stride, ws_stride, box_ptr, seen,
               tag, spin_limit, ctl_ptr, ticket, ROWS: tl.constexpr, K: tl.constexpr,
               BK: tl.constexpr, PTX: tl.constexpr):  # fmt: skip
    """Two one-token GEMV tasks of a stage at once, weight rows ``row_a ..`` and ``row_b ..``
    (ROWS each) against the same activation: ``_gemv_words`` over both tasks' rows, so both
    tasks' weights are in flight before the one wait. Returns ``(acc_a, acc_b, ok)``."""
    r = tl.arange(0, 2 * ROWS)
    rows = tl.where(r < ROWS, row_a + r, row_b + r - ROWS)
    acc, ok = _gemv_words(a_ptr, as_ptr, 0, 1, w_ptr, ws_ptr, rows, w_stride, ws_stride, box_ptr,
                          seen, tag, spin_limit, ctl_ptr, ticket, 1, K, BK, PTX)  # fmt: skip
    halves = tl.reshape(acc, (2, ROWS))
    first = (tl.arange(0, 2) == 0)[:, None]
    acc_a = tl.sum(tl.where(first, halves, 0.0), axis=0)[None, :]
    acc_b = tl.sum(tl.where(first, 0.0, halves), axis=0)[None, :]
    return acc_a, acc_b, ok


@triton.jit
def _block_dots(wf, a, w_scale):
    """``sum_b w_scale[:, b] * sum_j wf[:, b, j] a[b, j]``: fp32 sums, one per weight row."""
    return tl.sum(tl.sum(wf * a[None, :, :], axis=2) * w_scale, axis=1)


@triton.jit
def _gemv(
    a_ptr, as_ptr, ad_ptr, a_stride, S,
    w_ptr, ws_ptr, w_stride, ws_stride,
    box_ptr, seen, tag, spin_limit, ctl_ptr, ticket,
    ROWS: tl.constexpr, K: tl.constexpr, TB: tl.constexpr, BK: tl.constexpr, EXACT: tl.constexpr,
    CORES: tl.constexpr, WORDS: tl.constexpr, PTX: tl.constexpr, SPLIT: tl.constexpr,
    A_DEQ: tl.constexpr,
):
    """``acc [TB, ROWS] = dequant(a[:S, :K]) @ dequant(w[:ROWS, :K])^T`` after waiting on ``box``,
    unless its address is ``seen``: the mailbox this program's previous GEMV task waited on
    stays full for the rest of the launch, and that wait's acquire already ordered this program.

    The first two weight blocks (three with ``CORES``) are loaded before the wait; each later
    one as many blocks ahead of its multiply, so weights stream through the wait and the loop
    (they are read once: evict first). Returns ``(acc, ok)``.

    A K block is multiplied on tensor cores (both operands dequantized, TB token rows; with
    ``A_DEQ`` the activation block is loaded as the bf16 its producer dequantized, ``ad`` in
    ``a``'s layout, so only the weights are converted), or with ``CORES`` on CUDA cores (TB is
    then the next power of two >= S, ``Tuning.gemv_cores``): each MX block's 32 products with
    a token row's dequantized values summed in fp32, times the weight's scale, the blocks
    summed in fp32. With one token its activation block is loaded one block ahead, and each
    MX block's sum is added to its own lane across the K blocks; the lanes are summed
    once, after the loop (no reduction across warps in the loop). With ``WORDS`` (CUDA cores)
    ``_gemv_words`` does it for every token on weights held as int32 words. On tensor cores
    with ``SPLIT`` > 1 each K block's product runs as ``_mma_split``.
    """
    tl.static_assert(not (A_DEQ and CORES), "dequantized activations: tensor cores only")
    if WORDS:
        tl.static_assert(CORES, "weight words: tokens on CUDA cores")
        return _gemv_words(a_ptr, as_ptr, a_stride, S, w_ptr, ws_ptr, tl.arange(0, ROWS), w_stride,
                           ws_stride, box_ptr, seen, tag, spin_limit, ctl_ptr, ticket, TB, K, BK,
                           PTX)  # fmt: skip
    k = tl.arange(0, BK)
    kb = tl.arange(0, BK // MX)
    tok = tl.arange(0, TB)
    live = (tok < S)[:, None]
    w0, ws0 = _weight_block(w_ptr, ws_ptr, w_stride, ws_stride, 0, K, ROWS, BK)
    w1, ws1 = _weight_block(w_ptr, ws_ptr, w_stride, ws_stride, BK, K, ROWS, BK)
    if CORES:  # a third block in flight: the CUDA-core loop has the registers for it
        w2, ws2 = _weight_block(w_ptr, ws_ptr, w_stride, ws_stride, 2 * BK, K, ROWS, BK)
    ok = ticket >= 0
    if box_ptr.to(tl.int64) != seen:
        ok = _wait(box_ptr, tag, spin_limit, ctl_ptr, ticket)
    acc = tl.zeros((TB, ROWS), tl.float32)
    if CORES:
        BLOCKS: tl.constexpr = BK // MX
        a_at = kb[:, None] * MX + tl.arange(0, MX)[None, :]  # [BLOCKS, MX]
        if TB == 1:  # one token: its next activation block is loaded ahead of the products
            r8, r_s = _act_block(a_ptr, as_ptr, a_at, kb, 0, K, BK)
            lanes = tl.zeros((ROWS, BLOCKS), tl.float32)
        for k0 in range(0, K, BK):
            wf = tl.reshape(w0.to(tl.float32), (ROWS, BLOCKS, MX))
            w_scale = e8m0_scale_tl(ws0.to(tl.int32))  # [ROWS, BLOCKS]
            w0, ws0 = w1, ws1
            w1, ws1 = w2, ws2
            w2, ws2 = _weight_block(w_ptr, ws_ptr, w_stride, ws_stride, k0 + 3 * BK, K, ROWS, BK)
            if TB == 1:
                a = r8.to(tl.float32) * e8m0_scale_tl(r_s.to(tl.int32))[:, None]  # [BLOCKS, MX]
                r8, r_s = _act_block(a_ptr, as_ptr, a_at, kb, k0 + BK, K, BK)
                lanes += tl.sum(wf * a[None, :, :], axis=2) * w_scale
            else:
                for r in range(S):
                    r8, r_s = _act_block(a_ptr + r * a_stride, as_ptr + r * (a_stride // MX),
                                         a_at, kb, k0, K, BK)
                    a = r8.to(tl.float32) * e8m0_scale_tl(r_s.to(tl.int32))[:, None]
                    acc += tl.where(tok[:, None] == r, _block_dots(wf, a, w_scale)[None, :], 0.0)
        if TB == 1:
            acc += tl.sum(lanes, axis=1)[None, :]
        return acc, ok
    if SPLIT > 1:
        acc3 = tl.zeros((SPLIT, TB, ROWS), tl.float32)
    for k0 in range(0, K, BK):
        if A_DEQ:  # the dot's operand as read (bf16, exact)
            a_deq = tl.load(ad_ptr + tok[:, None] * a_stride + k0 + k[None, :],
                            mask=live & (k0 + k < K)[None, :], other=0.0, cache_modifier=".cg")
        else:
            a = tl.load(a_ptr + tok[:, None] * a_stride + k0 + k[None, :],
                        mask=live & (k0 + k < K)[None, :], other=0.0, cache_modifier=".cg")
            a_s = tl.load(as_ptr + tok[:, None] * (a_stride // MX) + k0 // MX + kb[None, :],
                          mask=live & (kb + k0 // MX < K // MX)[None, :], other=0,
                          cache_modifier=".cg")  # fmt: skip
        w_deq = mx_dequantize_tl(w0, ws0.to(tl.int32), ROWS, BK)
        w0, ws0 = w1, ws1
        w1, ws1 = _weight_block(w_ptr, ws_ptr, w_stride, ws_stride, k0 + 2 * BK, K, ROWS, BK)
        if not A_DEQ:
            a_deq = mx_dequantize_tl(a, a_s.to(tl.int32), TB, BK)
        if SPLIT > 1:
            acc3 = _mma_split(a_deq, w_deq, acc3, SPLIT, EXACT)
        else:
            acc = _mma(a_deq, tl.trans(w_deq), acc, EXACT)
    if SPLIT > 1:
        acc = tl.sum(acc3, axis=0)
    return acc, ok


# -- stages ------------------------------------------------------------------------


@triton.jit
def _xq(i, x_ptr, x8_ptr, x8s_ptr, x8d_ptr, S, HIDDEN: tl.constexpr, TB: tl.constexpr,
        BK: tl.constexpr, A_DEQ: tl.constexpr):  # fmt: skip
    """``x8, x8s = mxfp8(x[:, BK i ..])``: one block of x's columns (K half ``i // blocks``);
    with ``A_DEQ`` also ``x8d = bf16(dequant(x8, x8s))``."""
    tok = tl.arange(0, TB)
    live = (tok < S)[:, None]
    k = tl.arange(0, BK)
    kb = tl.arange(0, BK // MX)
    col = i * BK
    x = tl.load(x_ptr + tok[:, None] * HIDDEN + col + k[None, :], mask=live, other=0.0)
    values, codes = mx_quantize_tl(x.to(tl.float32), TB, BK)
    tl.store(x8_ptr + tok[:, None] * HIDDEN + col + k[None, :], values, mask=live)
    tl.store(x8s_ptr + tok[:, None] * (HIDDEN // MX) + col // MX + kb[None, :],
             codes.to(tl.uint8), mask=live)
    if A_DEQ:
        tl.store(x8d_ptr + tok[:, None] * HIDDEN + col + k[None, :],
                 mx_dequantize_tl(values, codes, TB, BK).to(tl.bfloat16), mask=live)


@triton.jit
def _rmsnorm(v, mask, w_ptr, n: tl.constexpr, eps, N_P: tl.constexpr):
    """``bf16(v / sqrt(mean(v^2) + eps) * w)`` over the first ``n`` of ``v [N_P]``, fp32 out."""
    w = tl.load(w_ptr + tl.arange(0, N_P), mask=mask, other=0.0).to(tl.float32)
    return bf16_round_tl(v * rms_factor_tl(v, n, eps) * w)


@triton.jit
def _norm(
    s, qkvp_ptr, q_norm_ptr, kv_norm_ptr, qx8_ptr, qx8s_ptr, qx8d_ptr, pos_ptr, slot_ptr, cos_ptr,
    sin_ptr, rope_rows, win_ptr, win_slots, cap, eps,
    Q_RANK: tl.constexpr, Q_RANK_P: tl.constexpr, QKV_ROWS: tl.constexpr, NOPE: tl.constexpr,
    WIN_BLOCK: tl.constexpr, A_DEQ: tl.constexpr,
):
    """Token s: ``qkv = bf16(p0 + p1)``, both RMSNorms, KV RoPE + record insert,
    ``qx8 = mxfp8(qr)`` (with ``A_DEQ`` also ``qx8d``, its values dequantized, bf16)."""
    c = tl.arange(0, Q_RANK_P)
    cm = c < Q_RANK
    row0 = qkvp_ptr + s * QKV_ROWS
    half1 = cap * QKV_ROWS  # qkvp is [2, cap, QKV_ROWS]
    qr = tl.load(row0 + c, mask=cm, other=0.0, cache_modifier=".cg")
    qr = bf16_round_tl(qr + tl.load(row0 + half1 + c, mask=cm, other=0.0, cache_modifier=".cg"))
    qr = _rmsnorm(qr, cm, q_norm_ptr, Q_RANK, eps, Q_RANK_P)
    values, codes = mx_quantize_tl(tl.reshape(qr, (1, Q_RANK_P)), 1, Q_RANK_P)
    tl.store(qx8_ptr + s * Q_RANK + c[None, :], values, mask=cm[None, :])
    cb = tl.arange(0, Q_RANK_P // MX)
    tl.store(qx8s_ptr + s * (Q_RANK // MX) + cb[None, :], codes.to(tl.uint8),
             mask=(cb < Q_RANK // MX)[None, :])
    if A_DEQ:
        tl.store(qx8d_ptr + s * Q_RANK + c[None, :],
                 mx_dequantize_tl(values, codes, 1, Q_RANK_P).to(tl.bfloat16), mask=cm[None, :])

    d = tl.arange(0, HEAD_DIM)
    kv = tl.load(row0 + Q_RANK + d, cache_modifier=".cg")
    kv = bf16_round_tl(kv + tl.load(row0 + half1 + Q_RANK + d, cache_modifier=".cg"))
    kv = _rmsnorm(kv, d < HEAD_DIM, kv_norm_ptr, HEAD_DIM, eps, HEAD_DIM)
    pos = tl.load(pos_ptr + s + tl.zeros((1,), tl.int32))
    kv = bf16_round_tl(_rope(tl.reshape(kv, (1, HEAD_DIM)), cos_ptr, sin_ptr, rope_rows, pos,
                             -(NOPE // 2), (HEAD_DIM - NOPE) // 2, 1, HALF_DIM, False))
    slot = tl.load(slot_ptr + s + tl.zeros((1,), tl.int32)).to(tl.int64)
    store_record_tl(win_ptr, slot, kv, win_slots, WIN_BLOCK, FMT_DS_MLA)


@triton.jit
def _keys(
    key_ptr, s, k0, win_ptr, comp_ptr, win_slots, comp_slots, KEYS: tl.constexpr,
    KS: tl.constexpr, WIN_BLOCK: tl.constexpr, COMP_BLOCK: tl.constexpr, HAS_COMP: tl.constexpr,
):
    """Token s's keys ``k0 .. k0 + KS`` through the key table: ``(bf16 [KS, 512], valid [KS])``.

    A key is bf16-exact (e4m3 times a power of two, or bf16), so bf16 holds it in half the
    registers; entries past ``KEYS`` are not valid.
    """
    e = k0 + tl.arange(0, KS)
    entries = tl.load(key_ptr + s * KEYS + e, mask=e < KEYS, other=-1)
    is_comp, slot, valid = decode_entries_tl(entries, win_slots, comp_slots)
    keys = load_keys_tl(win_ptr, slot, valid & ~is_comp, WIN_BLOCK, FMT_DS_MLA, KS)
    keys = keys.to(tl.bfloat16)
    if HAS_COMP:
        comp = load_keys_tl(comp_ptr, slot, valid & is_comp, COMP_BLOCK, FMT_DS_MLA, KS)
        keys = tl.where(is_comp[:, None], comp.to(tl.bfloat16), keys)
    return keys, valid


@triton.jit
def _attn(
    s, tile, chunk, q_ptr, key_ptr, win_ptr, comp_ptr, win_slots, comp_slots, part_ptr, pstat_ptr,
    box_ptr, tag, spin_limit, ctl_ptr, ticket, scale,
    HEADS: tl.constexpr, HEADS_P: tl.constexpr, KEYS: tl.constexpr, KC: tl.constexpr,
    KS: tl.constexpr, CHUNKS: tl.constexpr, WIN_BLOCK: tl.constexpr, COMP_BLOCK: tl.constexpr,
    HAS_COMP: tl.constexpr, EXACT: tl.constexpr,
):
    """Keys ``chunk * KC ..`` of token s, 16 heads: ``part = sum p k / sum p``,
    ``pstat = (max, sum p)``. q is read in the fused Q layout's memory order
    (``fused_layout_tl``: 512 contiguous bytes a warp's read) and permuted to heads after.

    The chunk runs in slices of KS keys (``Plan.key_slice``) with an online softmax (fewer
    registers than the whole chunk); the first slice's records are loaded before the wait on
    q. (Loading each next slice ahead of the current one's products spilled 450 B on SM90; one
    64-key slice spilled 248 B and made the step slower.)
    """
    k0 = chunk * KC
    keys, valid = _keys(key_ptr, s, k0, win_ptr, comp_ptr, win_slots, comp_slots, KEYS,
                        KS, WIN_BLOCK, COMP_BLOCK, HAS_COMP)
    h = tile * HEAD_TILE_ + tl.arange(0, HEAD_TILE_)
    hm = h < HEADS
    d = tl.arange(0, HEAD_DIM)
    q_at, q_ok = q_tile_at_tl(s, tile * HEAD_TILE_, HEADS, HEAD_TILE_, HEAD_DIM)
    ok = _wait(box_ptr, tag, spin_limit, ctl_ptr, ticket)
    q = q_tile_heads_tl(tl.load(q_ptr + q_at, mask=q_ok, other=0.0, cache_modifier=".cg"),
                        HEAD_TILE_, HEAD_DIM)
    top = tl.full((HEAD_TILE_,), float("-inf"), tl.float32)
    total = tl.zeros((HEAD_TILE_,), tl.float32)
    o = tl.zeros((HEAD_TILE_, HEAD_DIM), tl.float32)
    for k in range(k0, k0 + KC, KS):
        scores = _mma(q, tl.trans(keys), tl.zeros((HEAD_TILE_, KS), tl.float32), EXACT)
        scores = tl.where(valid[None, :], scores * scale, float("-inf"))
        new_top = tl.maximum(top, tl.max(scores, axis=1))
        safe = tl.where(new_top == float("-inf"), 0.0, new_top)
        alpha = tl.exp(top - safe)  # 0 while nothing was valid
        prob = tl.exp(scores - safe[:, None])
        o = _mma_fp32_lhs(prob, keys, o * alpha[:, None], EXACT)
        total = total * alpha + tl.sum(prob, axis=1)
        top = new_top
        if k + KS < k0 + KC:
            keys, valid = _keys(key_ptr, s, k + KS, win_ptr, comp_ptr, win_slots, comp_slots,
                                KEYS, KS, WIN_BLOCK, COMP_BLOCK, HAS_COMP)
    o = o / tl.where(total > 0, total, 1.0)[:, None]
    row = (s * CHUNKS + chunk) * HEADS_P + h
    tl.store(part_ptr + row[:, None] * HEAD_DIM + d[None, :], o, mask=hm[:, None])
    tl.store(pstat_ptr + row * 2, top, mask=hm)
    tl.store(pstat_ptr + row * 2 + 1, total, mask=hm)
    return ok


@triton.jit
def _combine(
    s, tile, part, part_ptr, pstat_ptr, sink_ptr, pos_ptr, cos_ptr, sin_ptr, rope_rows, xo_ptr,
    xos_ptr, xod_ptr, HEADS: tl.constexpr, HEADS_P: tl.constexpr, CHUNKS: tl.constexpr,
    CHUNKS_P: tl.constexpr, GROUP_K: tl.constexpr, NOPE: tl.constexpr, A_DEQ: tl.constexpr,
):
    """Dims ``part * DIMS ..`` of token s's 16 heads: merge the chunks, sink gate, inverse RoPE,
    bf16, MXFP8 -> xo (fused O layout; with ``A_DEQ`` its values dequantized -> xod, bf16).

    Every chunk's (max, sum) comes in one load (``CHUNKS_P``: CHUNKS padded to a power of
    two); each chunk's partial is loaded one chunk ahead of its products.
    """
    DIMS: tl.constexpr = HEAD_DIM // COMBINE_PARTS_
    h = tile * HEAD_TILE_ + tl.arange(0, HEAD_TILE_)
    hm = h < HEADS
    d0 = part * DIMS
    d = d0 + tl.arange(0, DIMS)
    j = tl.arange(0, CHUNKS_P)
    rows = (s * CHUNKS + j)[:, None] * HEADS_P + h[None, :]  # [CHUNKS_P, HEAD_TILE]
    live = (j < CHUNKS)[:, None] & hm[None, :]
    m_all = tl.load(pstat_ptr + rows * 2, mask=live, other=float("-inf"), cache_modifier=".cg")
    l_all = tl.load(pstat_ptr + rows * 2 + 1, mask=live, other=0.0, cache_modifier=".cg")
    top = tl.max(m_all, axis=0)
    top = tl.where(top > float("-inf"), top, 0.0)
    # A chunk without a valid key has sum 0 exactly; a NaN score's NaN sum flows into o.
    w_all = tl.where(l_all == 0.0, 0.0, l_all * tl.exp(m_all - top[None, :]))
    norm = tl.sum(w_all, axis=0)
    has_key = norm != 0.0
    o = tl.zeros((HEAD_TILE_, DIMS), tl.float32)
    row = s * CHUNKS * HEADS_P + h
    o_next = tl.load(part_ptr + row[:, None] * HEAD_DIM + d[None, :], mask=hm[:, None], other=0.0,
                     cache_modifier=".cg")
    for c in range(CHUNKS):
        o_c = o_next
        row += HEADS_P
        o_next = tl.load(part_ptr + row[:, None] * HEAD_DIM + d[None, :],
                         mask=hm[:, None] & (c + 1 < CHUNKS), other=0.0, cache_modifier=".cg")
        w_c = tl.sum(tl.where(j[:, None] == c, w_all, 0.0), axis=0)
        o += w_c[:, None] * o_c
    o = o / tl.where(has_key, norm, 1.0)[:, None]
    lse = top + tl.log(tl.where(has_key, norm, 1.0))
    sink = tl.load(sink_ptr + h, mask=hm, other=0.0)
    gate = 1.0 / (1.0 + tl.exp(sink - lse))
    o = tl.where(has_key[:, None], o * gate[:, None], 0.0)
    if d0 + DIMS > NOPE:
        pos = tl.load(pos_ptr + s + tl.zeros((HEAD_TILE_,), tl.int32))
        o = _rope(o, cos_ptr, sin_ptr, rope_rows, pos, (d0 - NOPE) // 2, (HEAD_DIM - NOPE) // 2,
                  HEAD_TILE_, DIMS // 2, True)
    values, codes = mx_quantize_tl(bf16_round_tl(o), HEAD_TILE_, DIMS)
    # Fused O: column (h // 8) * GROUP_K + ((d // 32) * 8 + h % 8) * 32 + d % 32.
    group0 = (h // HEADS_PER_GROUP) * GROUP_K
    hg = h % HEADS_PER_GROUP
    chunk_head = (d // MX * HEADS_PER_GROUP)[None, :] + hg[:, None]
    col = group0[:, None] + chunk_head * MX + d[None, :] % MX
    tl.store(xo_ptr + s * (HEADS * HEAD_DIM) + col, values, mask=hm[:, None])
    if A_DEQ:
        tl.store(xod_ptr + s * (HEADS * HEAD_DIM) + col,
                 mx_dequantize_tl(values, codes, HEAD_TILE_, DIMS).to(tl.bfloat16),
                 mask=hm[:, None])
    c = d0 // MX + tl.arange(0, DIMS // MX)
    code_col = (group0 // MX)[:, None] + c[None, :] * HEADS_PER_GROUP + hg[:, None]
    tl.store(xos_ptr + s * (HEADS * HEAD_DIM // MX) + code_col, codes.to(tl.uint8),
             mask=hm[:, None])


@triton.jit
def _wqkv_task(
    t, i, x8_ptr, x8s_ptr, x8d_ptr, xrdy_ptr, qkvp_ptr, w_ptr, ws_ptr, S, cap, seen, tag,
    spin_limit, ctl_ptr, HIDDEN: tl.constexpr, QKV_ROWS: tl.constexpr, TB: tl.constexpr,
    BK: tl.constexpr, EXACT: tl.constexpr, CORES: tl.constexpr, WORDS: tl.constexpr,
    PTX: tl.constexpr, SPLIT: tl.constexpr, A_DEQ: tl.constexpr,
):
    """``qkvp[half, :, rows] = x8[:, half] @ Wqkv[rows, half]^T``, 16 rows."""
    TILES: tl.constexpr = QKV_ROWS // WQKV_ROWS
    half = i // TILES
    row0 = (i % TILES) * WQKV_ROWS
    col0 = half * (HIDDEN // 2)
    acc, ok = _gemv(
        x8_ptr + col0, x8s_ptr + col0 // MX, x8d_ptr + col0, HIDDEN, S,
        w_ptr + row0 * HIDDEN + col0, ws_ptr + row0 * (HIDDEN // MX) + col0 // MX,
        HIDDEN, HIDDEN // MX, xrdy_ptr, seen, tag, spin_limit, ctl_ptr, t,
        WQKV_ROWS, HIDDEN // 2, TB, BK, EXACT, CORES, WORDS, PTX, SPLIT, A_DEQ,
    )
    tok = tl.arange(0, TB)
    r = tl.arange(0, WQKV_ROWS)
    tl.store(qkvp_ptr + (half * cap + tok[:, None]) * QKV_ROWS + row0 + r[None, :], acc,
             mask=(tok < S)[:, None])
    _arrive(xrdy_ptr + 2, 2 * TILES, tag, ok)
    return ok, xrdy_ptr.to(tl.int64)


@triton.jit
def _wqb_task(
    t, i, qx8_ptr, qx8s_ptr, qx8d_ptr, qrdy_ptr, q_ptr, w_ptr, ws_ptr, pos_ptr, cos_ptr, sin_ptr,
    rope_rows, S, seen, tag, spin_limit, ctl_ptr,
    Q_RANK: tl.constexpr, NOPE: tl.constexpr, HEADS: tl.constexpr, TB: tl.constexpr,
    BK: tl.constexpr, EXACT: tl.constexpr, CORES: tl.constexpr, WORDS: tl.constexpr,
    PTX: tl.constexpr, SPLIT: tl.constexpr, A_DEQ: tl.constexpr,
):
    """Fused-Q rows ``16 i ..`` (chunk ``i // heads`` of head ``i % heads``):
    ``q = rope(bf16(qx8 @ wq_b^T))``."""
    acc, ok = _gemv(
        qx8_ptr, qx8s_ptr, qx8d_ptr, Q_RANK, S,
        w_ptr + i * WQB_ROWS * Q_RANK, ws_ptr + i * WQB_ROWS * (Q_RANK // MX),
        Q_RANK, Q_RANK // MX, qrdy_ptr, seen, tag, spin_limit, ctl_ptr, t,
        WQB_ROWS, Q_RANK, TB, BK, EXACT, CORES, WORDS, PTX, SPLIT, A_DEQ,
    )
    _wqb_out(i, acc, ok, qrdy_ptr, q_ptr, pos_ptr, cos_ptr, sin_ptr, rope_rows, S, tag, NOPE, HEADS,
             TB)  # fmt: skip
    return ok, qrdy_ptr.to(tl.int64)


@triton.jit
def _wqb_pair(
    t, i, i2, qx8_ptr, qx8s_ptr, qrdy_ptr, q_ptr, w_ptr, ws_ptr, pos_ptr, cos_ptr, sin_ptr,
    rope_rows, S, seen, tag, spin_limit, ctl_ptr,
    Q_RANK: tl.constexpr, NOPE: tl.constexpr, HEADS: tl.constexpr, BK: tl.constexpr,
    PTX: tl.constexpr,
):
    """wq_b tasks ``i`` and ``i2`` of one token at once (``_gemv_pair``)."""
    acc, acc2, ok = _gemv_pair(qx8_ptr, qx8s_ptr, w_ptr, ws_ptr, i * WQB_ROWS, i2 * WQB_ROWS,
                               Q_RANK, Q_RANK // MX, qrdy_ptr, seen, tag, spin_limit, ctl_ptr, t,
                               WQB_ROWS, Q_RANK, BK, PTX)  # fmt: skip
    _wqb_out(i, acc, ok, qrdy_ptr, q_ptr, pos_ptr, cos_ptr, sin_ptr, rope_rows, S, tag, NOPE, HEADS,
             1)  # fmt: skip
    _wqb_out(i2, acc2, ok, qrdy_ptr, q_ptr, pos_ptr, cos_ptr, sin_ptr, rope_rows, S, tag, NOPE,
             HEADS, 1)  # fmt: skip
    return ok, qrdy_ptr.to(tl.int64)


@triton.jit
def _wqb_out(i, acc, ok, qrdy_ptr, q_ptr, pos_ptr, cos_ptr, sin_ptr, rope_rows, S, tag,
             NOPE: tl.constexpr, HEADS: tl.constexpr, TB: tl.constexpr):  # fmt: skip
    """wq_b task i's epilogue: ``q = rope(bf16(acc))`` stored, its head tile's mailbox told."""
    tok = tl.arange(0, TB)
    q = bf16_round_tl(acc)
    dim0 = (i // HEADS) * Q_CHUNK_
    if dim0 >= NOPE:
        pos = tl.load(pos_ptr + tok, mask=tok < S, other=0)
        q = _rope(q, cos_ptr, sin_ptr, rope_rows, pos, (dim0 - NOPE) // 2, (HEAD_DIM - NOPE) // 2,
                  TB, WQB_ROWS // 2, False)
        q = bf16_round_tl(q)
    r = tl.arange(0, WQB_ROWS)
    tl.store(q_ptr + tok[:, None] * (HEADS * HEAD_DIM) + i * WQB_ROWS + r[None, :],
             q.to(tl.bfloat16), mask=(tok < S)[:, None])
    tile = (i % HEADS) // HEAD_TILE_
    tile_heads = tl.minimum(HEADS - tile * HEAD_TILE_, HEAD_TILE_)
    _arrive(qrdy_ptr + 2 * (1 + tile), HEAD_DIM // Q_CHUNK_ * tile_heads, tag, ok)


@triton.jit
def _woa_task(
    t, i, xo_ptr, xos_ptr, xod_ptr, crdy_ptr, woap_ptr, wrdy_ptr, x8b_ptr, x8bs_ptr, x8bd_ptr,
    ardy_ptr, z_ptr, w_ptr, ws_ptr, S, cap, seen, tag, spin_limit, ctl_ptr,
    HEADS: tl.constexpr, O_RANK: tl.constexpr, GROUP_K: tl.constexpr, O_ROWS: tl.constexpr,
    PARTS: tl.constexpr, TB: tl.constexpr, BK: tl.constexpr, EXACT: tl.constexpr,
    CORES: tl.constexpr, WORDS: tl.constexpr,
    PTX: tl.constexpr, SPLIT: tl.constexpr, A_DEQ: tl.constexpr,
):
    """wo_a rows ``32 block ..`` of group ``32 block // o_rank``, K part ``part`` of PARTS;
    the block's last part: ``z = bf16(sum of the parts)``, ``x8b = mxfp8(z)`` (with ``A_DEQ``
    also ``x8bd``, its values dequantized, bf16)."""
    block = i // PARTS
    part = i % PARTS
    KP: tl.constexpr = GROUP_K // PARTS
    row0 = block * WOA_ROWS
    group = row0 // O_RANK
    col0 = group * GROUP_K + part * KP
    box = crdy_ptr + 2 * (group * HEADS_PER_GROUP // HEAD_TILE_)
    acc, ok = _gemv(
        xo_ptr + col0, xos_ptr + col0 // MX, xod_ptr + col0, HEADS * HEAD_DIM, S,
        w_ptr + row0 * GROUP_K + part * KP, ws_ptr + row0 * (GROUP_K // MX) + part * (KP // MX),
        GROUP_K, GROUP_K // MX, box, seen, tag, spin_limit, ctl_ptr, t,
        WOA_ROWS, KP, TB, BK, EXACT, CORES, WORDS, PTX, SPLIT, A_DEQ,
    )
    tok = tl.arange(0, TB)
    r = tl.arange(0, WOA_ROWS)
    live = (tok < S)[:, None]
    final = ok
    if PARTS > 1:
        at = tok[:, None] * O_ROWS + row0 + r[None, :]
        tl.store(woap_ptr + part * cap * O_ROWS + at, acc, mask=live)
        final = _arrive(wrdy_ptr + 2 * block, PARTS, tag, ok)
        if final:  # the block's last part: every part's partial is written
            tl.debug_barrier()
            p = tl.arange(0, PARTS)[:, None, None]
            acc = tl.sum(tl.load(woap_ptr + p * (cap * O_ROWS) + at[None, :, :],
                                 mask=live[None, :, :], other=0.0, cache_modifier=".cg"), axis=0)
    if final:
        z = bf16_round_tl(acc)
        values, codes = mx_quantize_tl(z, TB, WOA_ROWS)
        tl.store(z_ptr + tok[:, None] * O_ROWS + row0 + r[None, :], z.to(tl.bfloat16), mask=live)
        tl.store(x8b_ptr + tok[:, None] * O_ROWS + row0 + r[None, :], values, mask=live)
        tl.store(x8bs_ptr + tok[:, None] * (O_ROWS // MX) + block + tl.arange(0, 1)[None, :],
                 codes.to(tl.uint8), mask=live)
        if A_DEQ:
            tl.store(x8bd_ptr + tok[:, None] * O_ROWS + row0 + r[None, :],
                     mx_dequantize_tl(values, codes, TB, WOA_ROWS).to(tl.bfloat16), mask=live)
        _arrive(ardy_ptr, O_ROWS // WOA_ROWS, tag, final)
    return ok, box.to(tl.int64)


@triton.jit
def _wob_task(
    t, i, x8b_ptr, x8bs_ptr, x8bd_ptr, ardy_ptr, y_ptr, w_ptr, ws_ptr, S, seen, tag, spin_limit,
    ctl_ptr, HIDDEN: tl.constexpr, O_ROWS: tl.constexpr, TB: tl.constexpr, BK: tl.constexpr,
    EXACT: tl.constexpr, CORES: tl.constexpr, WORDS: tl.constexpr,
    PTX: tl.constexpr, SPLIT: tl.constexpr, A_DEQ: tl.constexpr,
):
    """y rows ``16 i ..``: ``y = bf16(x8b @ wo_b^T)``."""
    acc, ok = _gemv(
        x8b_ptr, x8bs_ptr, x8bd_ptr, O_ROWS, S,
        w_ptr + i * WOB_ROWS * O_ROWS, ws_ptr + i * WOB_ROWS * (O_ROWS // MX), O_ROWS, O_ROWS // MX,
        ardy_ptr, seen, tag, spin_limit, ctl_ptr, t,
        WOB_ROWS, O_ROWS, TB, BK, EXACT, CORES, WORDS, PTX, SPLIT, A_DEQ,
    )
    _wob_out(i, acc, y_ptr, S, HIDDEN, TB)
    return ok, ardy_ptr.to(tl.int64)


@triton.jit
def _wob_pair(
    t, i, i2, x8b_ptr, x8bs_ptr, ardy_ptr, y_ptr, w_ptr, ws_ptr, S, seen, tag, spin_limit, ctl_ptr,
    HIDDEN: tl.constexpr, O_ROWS: tl.constexpr, BK: tl.constexpr, PTX: tl.constexpr,
):
    """wo_b tasks ``i`` and ``i2`` of one token at once (``_gemv_pair``)."""
    acc, acc2, ok = _gemv_pair(x8b_ptr, x8bs_ptr, w_ptr, ws_ptr, i * WOB_ROWS, i2 * WOB_ROWS,
                               O_ROWS, O_ROWS // MX, ardy_ptr, seen, tag, spin_limit, ctl_ptr, t,
                               WOB_ROWS, O_ROWS, BK, PTX)  # fmt: skip
    _wob_out(i, acc, y_ptr, S, HIDDEN, 1)
    _wob_out(i2, acc2, y_ptr, S, HIDDEN, 1)
    return ok, ardy_ptr.to(tl.int64)


@triton.jit
def _wob_out(i, acc, y_ptr, S, HIDDEN: tl.constexpr, TB: tl.constexpr):
    """wo_b task i's epilogue: ``y = bf16(acc)`` stored."""
    tok = tl.arange(0, TB)
    r = tl.arange(0, WOB_ROWS)
    tl.store(y_ptr + tok[:, None] * HIDDEN + i * WOB_ROWS + r[None, :],
             bf16_round_tl(acc).to(tl.bfloat16), mask=(tok < S)[:, None])


# -- the kernel ----------------------------------------------------------------------


@triton.jit
def _trace(trace_ptr, ticket, started, ended):
    """``trace[ticket] = (started, ended, program)`` (nothing for a ticket < 0)."""
    row = trace_ptr + 3 * ticket.to(tl.int64)
    live = ticket >= 0
    tl.store(row, started, mask=live)
    tl.store(row + 1, ended, mask=live)
    tl.store(row + 2, tl.program_id(0).to(tl.int64), mask=live)


@triton.jit
def mono_kernel(
    # scratch regions (plan.py) and control words
    ctl_ptr, x8_ptr, x8s_ptr, xrdy_ptr, qkvp_ptr, qx8_ptr, qx8s_ptr, qrdy_ptr, q_ptr,
    part_ptr, pstat_ptr, srdy_ptr, xo_ptr, xos_ptr, crdy_ptr, x8b_ptr, x8bs_ptr, ardy_ptr, z_ptr,
    woap_ptr, wrdy_ptr,
    # with A_DEQ: x8, qx8, xo and x8b's values dequantized, bf16 (plan.DEQUANTIZED)
    x8d_ptr, qx8d_ptr, xod_ptr, x8bd_ptr,
    # step inputs and output
    x_ptr, pos_ptr, slot_ptr, key_ptr, win_ptr, comp_ptr, y_ptr,
    # int64 [tasks, 3] (start ns, end ns, program) of every task when TRACE
    trace_ptr,
    # weights and rope tables
    wqkv_ptr, wqkv_s_ptr, q_norm_ptr, kv_norm_ptr, wqb_ptr, wqb_s_ptr, woa_ptr, woa_s_ptr,
    wob_ptr, wob_s_ptr, sink_ptr, cos_ptr, sin_ptr,
    # runtime scalars: tokens, the scratch's token capacity, cache sizes, rope table rows,
    # spin bound, stage ends (Plan.stages)
    S, cap, win_slots, comp_slots, rope_rows, spin_limit,
    end_xq, end_wqkv, end_norm, end_wqb, end_attn, end_combine, end_woa, end_wob,
    eps, scale,
    # geometry
    HIDDEN: tl.constexpr, Q_RANK: tl.constexpr, Q_RANK_P: tl.constexpr, QKV_ROWS: tl.constexpr,
    NOPE: tl.constexpr, HEADS: tl.constexpr, HEAD_TILES: tl.constexpr, O_RANK: tl.constexpr,
    GROUP_K: tl.constexpr, O_ROWS: tl.constexpr, WOA_PARTS: tl.constexpr, KEYS: tl.constexpr,
    KC: tl.constexpr, KS: tl.constexpr, CHUNKS: tl.constexpr, CHUNKS_P: tl.constexpr,
    WIN_BLOCK: tl.constexpr, COMP_BLOCK: tl.constexpr, HAS_COMP: tl.constexpr,
    # tiling
    TB: tl.constexpr, BK_X: tl.constexpr, BK_QR: tl.constexpr, BK_GK: tl.constexpr,
    BK_OR: tl.constexpr, EXACT: tl.constexpr, GEMV_CORES: tl.constexpr = False,
    TRACE: tl.constexpr = False, GEMV_WORDS: tl.constexpr = False, CVT_PTX: tl.constexpr = False,
    MMA_SPLIT: tl.constexpr = 1, GEMV_PAIRS: tl.constexpr = False, A_DEQ: tl.constexpr = False,
):
    """One layer step: take tickets until ``end_wob`` (the task count) or an error, a loop a
    stage.

    With ``TRACE`` each task's start and end (``%globaltimer``, waits included) and
    the program that ran it go to ``trace[ticket]`` (NVIDIA only; not in the interpreter).
    ``GEMV_WORDS`` (with ``GEMV_CORES``): the GEMV tasks hold their weights as int32 words
    (``_gemv_words``, 3 blocks in flight), converted with PTX when ``CVT_PTX`` (NVIDIA, not
    the interpreter).
    ``GEMV_PAIRS`` (one token, with ``GEMV_WORDS``): a wq_b or wo_b task takes its program's
    next ticket before it starts; when that ticket is a task of the same stage both run as
    one (``_gemv_pair``), else the next ticket is held for the next turn of the loop.
    ``A_DEQ`` (tensor cores): each MXFP8 activation's producer also stores its values
    dequantized (bf16) and the tensor-core GEMV reads those (``Tuning.a_dequantized``).
    """
    HEADS_P: tl.constexpr = HEAD_TILES * HEAD_TILE_
    XQ_TASKS: tl.constexpr = HIDDEN // BK_X
    tag = tl.atomic_add(ctl_ptr + CTL_EPOCH_, 0, sem="acquire", scope="gpu")
    t = tl.atomic_add(ctl_ptr + CTL_TICKET_, 1, sem="relaxed", scope="gpu")
    ok = t >= 0
    seen = ctl_ptr.to(tl.int64)  # address of the mailbox this program's last GEMV task waited on
    held = t * 0 - 1  # a ticket taken ahead (GEMV_PAIRS), -1 when none
    # A loop a stage (module docstring): on gfx942 one loop over every stage spilled 48 VGPRs
    # at 8 waves (tp 4, M = 1), attention's hoisted addresses live through the GEMV stages.
    for STAGE in tl.static_range(8):
        end = (end_xq, end_wqkv, end_norm, end_wqb, end_attn, end_combine, end_woa, end_wob)[STAGE]
        while (t < end) & ok:
            if TRACE:
                started = globaltimer_tl(t)
            paired = t * 0 - 1  # the ticket run together with t, -1 when none
            pair = False  # a constexpr unless GEMV_PAIRS: no pair code in the kernel then
            # Nested: a constexpr joined to a tensor with `and` is not dropped at compile time
            # by every Triton, so constexpr guards stand alone.
            if GEMV_PAIRS:  # noqa: SIM102
                if (STAGE == 3) or (STAGE == 7):  # wq_b, wo_b
                    held = tl.atomic_add(ctl_ptr + CTL_TICKET_, 1, sem="relaxed", scope="gpu")
                    if held < end:  # the same stage as t
                        paired = held
                        held = t * 0 - 1
                    pair = paired >= 0
            if STAGE == 0:  # xq is the first stage: its task index is the ticket
                _xq(t, x_ptr, x8_ptr, x8s_ptr, x8d_ptr, S, HIDDEN, TB, BK_X, A_DEQ)
                _arrive(xrdy_ptr, XQ_TASKS, tag, ok)
            elif STAGE == 1:
                ok, seen = _wqkv_task(t, t - end_xq, x8_ptr, x8s_ptr, x8d_ptr, xrdy_ptr, qkvp_ptr,
                                      wqkv_ptr, wqkv_s_ptr, S, cap, seen, tag, spin_limit,
                                      ctl_ptr, HIDDEN, QKV_ROWS, TB, BK_X, EXACT, GEMV_CORES,
                                      GEMV_WORDS, CVT_PTX, MMA_SPLIT, A_DEQ)
            elif STAGE == 2:
                ok = _wait(xrdy_ptr + 2, tag, spin_limit, ctl_ptr, t)
                if ok:
                    _norm(t - end_wqkv, qkvp_ptr, q_norm_ptr, kv_norm_ptr, qx8_ptr, qx8s_ptr,
                          qx8d_ptr, pos_ptr, slot_ptr, cos_ptr, sin_ptr, rope_rows, win_ptr,
                          win_slots, cap, eps, Q_RANK, Q_RANK_P, QKV_ROWS, NOPE, WIN_BLOCK, A_DEQ)
                _arrive(qrdy_ptr, S, tag, ok)
            elif STAGE == 3:
                if pair:
                    ok, seen = _wqb_pair(t, t - end_norm, paired - end_norm, qx8_ptr, qx8s_ptr,
                                         qrdy_ptr, q_ptr, wqb_ptr, wqb_s_ptr, pos_ptr, cos_ptr,
                                         sin_ptr, rope_rows, S, seen, tag, spin_limit, ctl_ptr,
                                         Q_RANK, NOPE, HEADS, BK_QR, CVT_PTX)
                else:
                    ok, seen = _wqb_task(t, t - end_norm, qx8_ptr, qx8s_ptr, qx8d_ptr, qrdy_ptr,
                                         q_ptr, wqb_ptr, wqb_s_ptr, pos_ptr, cos_ptr, sin_ptr,
                                         rope_rows, S, seen, tag, spin_limit, ctl_ptr, Q_RANK,
                                         NOPE, HEADS, TB, BK_QR, EXACT, GEMV_CORES, GEMV_WORDS,
                                         CVT_PTX, MMA_SPLIT, A_DEQ)
            elif STAGE == 4:
                i = t - end_wqb
                s = i // (HEAD_TILES * CHUNKS)
                tile = (i // CHUNKS) % HEAD_TILES
                ok = _wait(qrdy_ptr, tag, spin_limit, ctl_ptr, t)  # records inserted
                if ok:
                    ok = _attn(s, tile, i % CHUNKS, q_ptr, key_ptr, win_ptr, comp_ptr, win_slots,
                               comp_slots, part_ptr, pstat_ptr, qrdy_ptr + 2 * (1 + tile), tag,
                               spin_limit, ctl_ptr, t, scale, HEADS, HEADS_P, KEYS, KC, KS,
                               CHUNKS, WIN_BLOCK, COMP_BLOCK, HAS_COMP, EXACT)
                _arrive(srdy_ptr + 2 * (s * HEAD_TILES + tile), CHUNKS, tag, ok)
            elif STAGE == 5:
                i = t - end_attn
                st = i // COMBINE_PARTS_  # (token, tile) pair: its srdy mailbox
                tile = st % HEAD_TILES
                ok = _wait(srdy_ptr + 2 * st, tag, spin_limit, ctl_ptr, t)
                if ok:
                    _combine(st // HEAD_TILES, tile, i % COMBINE_PARTS_, part_ptr, pstat_ptr,
                             sink_ptr, pos_ptr, cos_ptr, sin_ptr, rope_rows, xo_ptr, xos_ptr,
                             xod_ptr, HEADS, HEADS_P, CHUNKS, CHUNKS_P, GROUP_K, NOPE, A_DEQ)
                _arrive(crdy_ptr + 2 * tile, S * COMBINE_PARTS_, tag, ok)
            elif STAGE == 6:
                ok, seen = _woa_task(t, t - end_combine, xo_ptr, xos_ptr, xod_ptr, crdy_ptr,
                                     woap_ptr, wrdy_ptr, x8b_ptr, x8bs_ptr, x8bd_ptr, ardy_ptr,
                                     z_ptr, woa_ptr, woa_s_ptr, S, cap, seen, tag, spin_limit,
                                     ctl_ptr, HEADS, O_RANK, GROUP_K, O_ROWS, WOA_PARTS, TB,
                                     BK_GK, EXACT, GEMV_CORES, GEMV_WORDS, CVT_PTX, MMA_SPLIT,
                                     A_DEQ)
            else:
                if pair:
                    ok, seen = _wob_pair(t, t - end_woa, paired - end_woa, x8b_ptr, x8bs_ptr,
                                         ardy_ptr, y_ptr, wob_ptr, wob_s_ptr, S, seen, tag,
                                         spin_limit, ctl_ptr, HIDDEN, O_ROWS, BK_OR, CVT_PTX)
                else:
                    ok, seen = _wob_task(t, t - end_woa, x8b_ptr, x8bs_ptr, x8bd_ptr, ardy_ptr,
                                         y_ptr, wob_ptr, wob_s_ptr, S, seen, tag, spin_limit,
                                         ctl_ptr, HIDDEN, O_ROWS, TB, BK_OR, EXACT, GEMV_CORES,
                                         GEMV_WORDS, CVT_PTX, MMA_SPLIT, A_DEQ)
            if TRACE:
                ended = globaltimer_tl(t)
                _trace(trace_ptr, t, started, ended)
                if GEMV_PAIRS:
                    _trace(trace_ptr, paired, started, ended)
            if ok:
                # An atomic: one thread takes the ticket and the CTA shares it, so every thread
                # leaves the loop together. A timed-out wait pushed the counter past every task.
                take = True
                if GEMV_PAIRS:
                    take = held < 0
                if take:
                    t = tl.atomic_add(ctl_ptr + CTL_TICKET_, 1, sem="relaxed", scope="gpu")
                else:
                    t = held
                    held = t * 0 - 1
    # The last program out resets the ticket and advances the epoch for the next step.
    done = tl.atomic_add(ctl_ptr + CTL_FINISHED_, 1, sem="acq_rel", scope="gpu")
    if done == tl.num_programs(0) - 1:
        tl.atomic_xchg(ctl_ptr + CTL_TICKET_, 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(ctl_ptr + CTL_FINISHED_, 0, sem="relaxed", scope="gpu")
        tl.atomic_add(ctl_ptr + CTL_EPOCH_, 1, sem="release", scope="gpu")
