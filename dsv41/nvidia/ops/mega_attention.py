"""Mega attention: fused-layout q in, fused MXFP8 xo out, for one decode step (docs/design.md
§2.4-2.7).

For token ``m`` and head ``h`` over the valid keys ``k`` of ``key_table[m]``
(V = K, all 512 dims; docs/design.md §4):

    q = bf16(rope(q_fused[m, head h], positions[m]))          (dims 448.. turned forward)
    s = q . k * softmax_scale,  lse = logsumexp(s)
    o = softmax(s) @ V * 1 / (1 + exp(attn_sink[h] - lse))   (0 when no key is valid)
    o = bf16(inverse_rope(o, positions[m]))
    xo, codes = mxfp8(o) per 32 dims, written in the fused O layout

so no kernel of the step shuffles q or o. A program covers a tile of
``HEAD_TILE`` heads (masked past the rank's heads) of one token and one split
of the key table: the scores of the tile are one ``[16, 512] x [512, BK]`` dot
per block of keys, the output one ``[16, BK] x [BK, 512]`` dot on the same
dequantized key tile (FlashMLA's shape). Keys are read straight from the paged
records of either format (``kv_records_tl.load_records_tl``: every load of a block, the
scale codes as 4-byte words too, is one the loop's pipeliner copies a block ahead).

When M is small the key table is split over several programs so the GPU fills
at M = 1. Each split writes fp32 partials (unnormalised o, running max, sum),
and a second launch combines them: one program per (token, head tile, 32-dim
chunk, ``COMBINE_HEADS`` heads), so the combine reads the partials in parallel
rather than through one program, and the epilogue (sink, inverse RoPE, bf16,
MXFP8 cast, fused-O store) is chunk-local (RoPE pairs and MX blocks never cross
a 32-dim chunk); from ``COMBINE_WIDE_SPLITS`` splits on, a combine program reads all its
partials at once (the splits as a power of two and the rest, a load each). With one split the
attention program runs the epilogue itself.
Neither launch syncs with the host or keeps state between calls, so a step can be captured
in a CUDA graph. Products of a bf16 q and a dequantized key are exact in bf16, so
on the GPU the score dot runs on bf16 operands and the output dot on a bf16
hi + lo split of the probabilities (~16 bits); the interpreter (whose bf16 dot
is broken) uses fp32 operands.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import triton
import triton.language as tl

from dsv41.common.fused_layout import O_CHUNK
from dsv41.common.fused_layout_tl import q_tile_at_tl, q_tile_heads_tl
from dsv41.common.geometry import HEAD_TILE
from dsv41.common.kv_cache import KV_DIM, NOPE_DIM, ROPE_DIM, PagedKVCache
from dsv41.common.kv_records_tl import fmt_id, load_records_tl
from dsv41.common.mx import (
    E4M3,
    MX_BLOCK,
    bf16_rn_tl,
    bf16_round_tl,
    mx_dequantize_tl,
    mx_quantize_tl,
)
from dsv41.common.platform import current_platform
from dsv41.common.rope import rope_pair_tl
from dsv41.common.timer_tl import clock64_tl, globaltimer_tl, smid_tl
from dsv41.nvidia.ops.launch import bucket_for, interpreting, sm_count
from dsv41.nvidia.ops.pdl import pdl_enabled, pdl_launch_options, pdl_prologue_tl
from dsv41.nvidia.ops.record_prefetch import (
    prefetch_records_tl,
    record_ptrs_tl,
    record_row_ptrs_tl,
    rows_aligned,
)
from dsv41.nvidia.ops.sm_share import launch_alone

HEAD_DIM = KV_DIM  # 512: q, k, v and o dims of a head (MQA, V = K)
KEY_BLOCK = 16  # keys a dot covers (the smallest MMA N)
# From KEY_BLOCK_32_TOKENS tokens a dot covers 32 keys (AttentionTuning.key_block): the H200,
# tp 4, with dequantized GEMM activations: 57.1 against 58.3 us a step at M = 4, 102.5 against
# 108.5 at M = 48; at M = 1 16 keys (23.6 against 25.6 us). SM90, M = 48: 243 registers, no
# spill; 64 keys spill (kernel_facts.py). A split of no whole 32-key blocks stops its last
# block at its end, so the 16-key splits serve it.
KEY_BLOCK_32_TOKENS = 4
KEY_BLOCKS = (16, 32)
COMBINE_CHUNK = O_CHUNK  # 32 dims a combine program finishes: one MX block, whole RoPE pairs
COMBINE_HEADS = 4  # heads a combine program finishes: 4 programs a head tile and chunk, so
# the partials of M = 1 (40 splits x 16 heads x 512 dims) are read by 64 programs, not 16 (16,
# 2 and 1 heads a program measured slower on the H200)
# From this many splits on, the combine reads all of a program's partials in one load each, as a
# power of two and the rest (``split_pieces``; SM90: 14 loads a thread instead of 160 at 40
# splits): faster at 40 splits, slower at 20 and below on the H200.
COMBINE_WIDE_SPLITS = 32
# Split the keys until the launch has at most this many programs a SM, so it runs in one wave:
# (most tiles, programs a SM) for each tier of (token, head tile) pairs. An attention program
# takes 112 to 250 registers and 58 KB of shared memory, so a SM holds 2 of them: past 32 tiles
# 2 a SM (H200, tp 4, M = 48: 5 splits, 116.7 us a step against 132.9 with 4 a SM's 10 splits;
# attention alone 39.7 us against 46.4 with 10 splits, 44.4 with 4, 56.8 with 20). Up to 32
# tiles the tiers measured against 4 a SM everywhere (2 to 15 % faster on the H200, tp 4, M = 16:
# 73.2 against 78.3 us a step).
PROGRAM_TIERS = ((16, 1), (64, 2), (None, 3))
# On ROCm (the fallback, unmeasured there) the earlier H200 tiers, rounded up: at least that many
# a SM. The one-wave splits of 4 tokens' worth of head tiles spill VGPRs on gfx942 at M = 48.
ROCM_PROGRAM_TIERS = ((16, 1), (32, 2), (64, 4), (None, 3))
# Warps of an attention program: 8 or 16 (fewer instructions a warp, fewer programs a SM) were
# level or slower at every M on the H200 (tp 4, M = 48: 161.4 us with 8 against 136.0 with 4).
ATTN_WARPS = 4
# Attention's programs hold their SMs alone (``attention_alone``) while the launch has at most
# 1 / ALONE_SMS_SHARE of the SMs' count of programs: tp 4, M = 1 (40 programs) on the H200,
# where the weight streams of wo_a's early-launched programs otherwise share its SMs (24.5
# against 24.9 us). Two programs a SM, or the combine alone too, were slower.
# Splits of several key blocks (their loop is longer, so more of it meets the weight streams)
# hold their SMs alone up to 1 / ALONE_SMS_SHARE_LONG of the SMs' count: tp 2, M = 2 (80
# programs of 2 blocks) 63.8 against 65.8 us; one-block splits at 80 programs stay shared (tp 2,
# M = 1 was slower alone).
ALONE_SMS_SHARE = 3
ALONE_SMS_SHARE_LONG = 1.5
# The score dot [16 heads, 512] x [512, 16 keys] is one chain of 32 dependent MMAs a warp; in 4
# segments of 128 dims (a batched dot, summed after) it is 4 short chains (SM90: 940 SASS
# instructions a warp and key block instead of 1,073): faster up to 16 (token, head tile) pairs
# on the H200 (tp 4, M = 1: 36.0 against 37.7 us), slower at 48, so one segment above.
QK_SEGMENTS = 4
QK_SEGMENTS_TILES = 16
LOG2_E = math.log2(math.e)

_HEAD_DIM = tl.constexpr(HEAD_DIM)
_NOPE = tl.constexpr(NOPE_DIM)  # 448
_HALF_ROPE = tl.constexpr(ROPE_DIM // 2)  # 32 rope pairs: the width of the cos / sin tables
_O_CHUNK = tl.constexpr(O_CHUNK)  # 32
_LN2 = tl.constexpr(math.log(2.0))
# The opt-in trace of the attention launches (``profile_step.py --attn-trace`` sets
# ``trace_buffer``, int64 [>= programs of both launches, TRACE_FIELDS], GPU only): each program
# stamps %globaltimer (ns) into its row. Attention: start, its early keys in registers (0 where
# not EARLY), PDL wait over, q RoPE'd, its loop done, end, SM, and an early block's scores (0
# where not EARLY); the combine, in the rows after attention's: start, 0, wait over, 0, 0, end,
# SM. Field f + CLOCK (f != 6) holds the SM's %clock64 at stamp f, so a program's intervals
# come in cycles (the global timer ticks in 0.256 us on the H200), and attention's field 14 the
# cycles when q's raw load arrived. A stamp after data takes an operand computed from that data,
# so it is not taken before the data arrives (a reduction each: the trace perturbs what it
# measures a little).
CLOCK = 8
Q_LOADED = 14
TRACE_FIELDS = 16
_TRACE_FIELDS = tl.constexpr(TRACE_FIELDS)
_CLOCK = tl.constexpr(CLOCK)
_Q_LOADED = tl.constexpr(Q_LOADED)
trace_buffer: torch.Tensor | None = None


@triton.jit
def _stamp_now_tl(at, field: tl.constexpr, like):
    """%globaltimer into ``at[field]`` and %clock64 into ``at[field + CLOCK]``, taken after the
    int32 scalar ``like`` is."""
    tl.store(at + field, globaltimer_tl(like))
    tl.store(at + field + _CLOCK, clock64_tl(like))


@triton.jit
def _arrived_tl(data):
    """An int32 scalar computed from every element of the fp32 tensor ``data``: a stamp that
    takes it is not taken before ``data`` is."""
    return tl.sum(tl.reshape(data, (data.numel,)), axis=0).to(tl.int32)


@triton.jit
def _stamp_tl(at, field: tl.constexpr, data):
    """``_stamp_now_tl`` once the fp32 tensor ``data`` is computed."""
    _stamp_now_tl(at, field, _arrived_tl(data))


@triton.jit
def _rope_angles_tl(d0, pos, max_pos, cos_ptr, sin_ptr, W: tl.constexpr):
    """``(cos, sin) [W / 2]`` of the column pairs of dims ``d0 .. d0 + W`` (``d0`` even) of a head
    at ``pos``: the GPT-J pair ``(448 + 2i, 449 + 2i)``'s angle, (1, 0) for nope pairs and a bad
    position. A kernel reads them before its PDL wait: no step kernel writes positions or tables."""
    i = (d0 - _NOPE) // 2 + tl.arange(0, W // 2)  # rope pair of each column pair, < 0 for nope
    at = pos * _HALF_ROPE + i
    turn = tl.where((pos >= 0) & (pos < max_pos), i, -1) >= 0  # nope pairs, bad positions stay put
    return tl.load(cos_ptr + at, mask=turn, other=1.0), tl.load(sin_ptr + at, mask=turn, other=0.0)


@triton.jit
def _rope_tl(x, c, s, ROWS: tl.constexpr, W: tl.constexpr, INVERSE: tl.constexpr):
    """fp32 ``x [ROWS, W]`` holding W dims of a head, each column pair turned by its angle ``(c,
    s) [W / 2]`` (``_rope_angles_tl``; back if INVERSE)."""
    v0, v1 = tl.split(tl.reshape(x, (ROWS, W // 2, 2)))
    r0, r1 = rope_pair_tl(v0, v1, c[None, :], s[None, :], INVERSE)
    return tl.reshape(tl.join(r0, r1), (ROWS, W))


@triton.jit
def _load_q_tl(q_ptr, token, head0, H: tl.constexpr, HT: tl.constexpr):
    """fp32 ``[HT, 512]``: q of heads ``head0 ..`` of ``token`` from the fused Q layout (0 for
    heads past H), read in the layout's memory order (``fused_layout_tl``)."""
    at, ok = q_tile_at_tl(token, head0, H, HT, _HEAD_DIM)
    raw = tl.load(q_ptr + at, mask=ok, other=0.0)
    return q_tile_heads_tl(raw, HT, _HEAD_DIM).to(tl.float32)


@triton.jit
def _epilogue_tl(
    acc, l_i, m_i, d0, token, heads, head_ok, sink, c, s, xo_ptr, codes_ptr, lse_ptr,
    xo_deq_ptr, H: tl.constexpr, G: tl.constexpr, HT: tl.constexpr, W: tl.constexpr,
    HW: tl.constexpr, XO_DEQ: tl.constexpr,
):  # fmt: skip
    """Dims ``d0 .. d0 + W`` of the tile's heads from ``acc = sum 2^(s2 - m_i) v`` and ``l_i = sum
    2^(s2 - m_i)`` (log2 units): sink gate, inverse RoPE, bf16, MXFP8 stored in the fused O
    layout; lse stored by the programs holding dim 0. ``sink`` (the heads' sink logits) and ``(c,
    s)`` (``_rope_angles_tl`` of these dims) are read before the PDL wait: no step kernel writes
    them. ``HW`` (the GPU): the bf16 round is the hardware's cast. ``XO_DEQ``: the MXFP8
    values dequantized go to ``xo_deq`` as bf16 too, at the same fused O offsets."""
    has_key = l_i != 0.0  # 0 exactly without a valid key; NaN (a NaN score) flows on
    lse = tl.where(has_key, (m_i + tl.log2(tl.where(has_key, l_i, 1.0))) * _LN2, -float("inf"))
    gate = 1.0 / (1.0 + tl.exp(sink - lse))
    o = acc * tl.where(has_key, gate / tl.where(has_key, l_i, 1.0), 0.0)[:, None]
    o = bf16_rn_tl(_rope_tl(o, c, s, HT, W, True), HW)
    values, codes = mx_quantize_tl(o, HT, W)
    # Fused O: head g * G + e, dim c * 32 + j -> g * G * 512 + (c * G + e) * 32 + j; code at
    # g * G * 16 + c * G + e.
    CHUNKS: tl.constexpr = _HEAD_DIM // _O_CHUNK
    d = d0 + tl.arange(0, W)
    xo_row = token * (H * _HEAD_DIM) + (heads // G) * (G * _HEAD_DIM) + (heads % G) * _O_CHUNK
    xo_col = d // _O_CHUNK * (G * _O_CHUNK) + d % _O_CHUNK
    tl.store(xo_ptr + xo_row[:, None] + xo_col[None, :], values.to(tl.uint8, bitcast=True),
             mask=head_ok[:, None])  # fmt: skip
    if XO_DEQ:
        deq = mx_dequantize_tl(values, codes, HT, W).to(tl.bfloat16)
        tl.store(xo_deq_ptr + xo_row[:, None] + xo_col[None, :], deq, mask=head_ok[:, None])
    c = d0 // _O_CHUNK + tl.arange(0, W // _O_CHUNK)
    codes_row = token * (H * CHUNKS) + (heads // G) * (G * CHUNKS) + heads % G
    tl.store(codes_ptr + codes_row[:, None] + (c * G)[None, :], codes.to(tl.uint8),
             mask=head_ok[:, None])  # fmt: skip
    lse_ok = tl.where(d0 == 0, heads, H) < H
    tl.store(lse_ptr + token * H + heads, lse, mask=lse_ok)


@triton.jit
def _key_block_tl(table_row, k0, win_ptr, comp_ptr, window_slots, compressed_slots,
                  END, FMT: tl.constexpr, WIN_BLOCK: tl.constexpr,
                  COMP_BLOCK: tl.constexpr, BK: tl.constexpr,
                  ALIGNED: tl.constexpr):  # fmt: skip
    """Keys ``k0 .. k0 + BK`` (those before ``END``) of a key-table row: fp32 ``[BK, 512]`` and
    which are valid."""
    kk = k0 + tl.arange(0, BK)
    data_ptrs, code_ptrs, valid = record_ptrs_tl(table_row, kk, kk < END, win_ptr, comp_ptr,
                                                 window_slots, compressed_slots, FMT, WIN_BLOCK,
                                                 COMP_BLOCK, ALIGNED)  # fmt: skip
    return load_records_tl(data_ptrs, code_ptrs, valid, FMT, BK, ALIGNED), valid


@triton.jit
def _dot_tl(a, b, DOT_BF16: tl.constexpr):
    """``a @ b`` in fp32: bf16 operands on the GPU, IEEE fp32 ones under the interpreter."""
    if DOT_BF16:
        return tl.dot(a, b)
    return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _scores_tl(a, b, SPLIT: tl.constexpr, DOT_BF16: tl.constexpr):
    """``a [R, 512] . b [C, 512]^T`` -> fp32 ``[R, C]`` (q and keys, either way round). With
    ``SPLIT`` > 1 the 512 dims are cut into SPLIT segments, one batch of a batched dot each,
    summed after: a warp then runs SPLIT independent chains of MMAs over 512 / SPLIT dims
    instead of one chain over 512."""
    if SPLIT == 1:
        s = _dot_tl(a, tl.trans(b), DOT_BF16)
    else:
        R: tl.constexpr = a.shape[0]
        C: tl.constexpr = b.shape[0]
        SEG: tl.constexpr = a.shape[1] // SPLIT
        a3 = tl.permute(tl.reshape(a, (R, SPLIT, SEG)), (1, 0, 2))
        b3 = tl.permute(tl.reshape(b, (C, SPLIT, SEG)), (1, 2, 0))
        s = tl.sum(_dot_tl(a3, b3, DOT_BF16), axis=0)
    return s


@triton.jit
def _key_step_tl(q, k, valid, m_i, l_i, acc, qk_scale, QK_SPLIT: tl.constexpr,
                 DOT_BF16: tl.constexpr, FIRST: tl.constexpr,
                 KEYS_A: tl.constexpr = False):  # fmt: skip
    """One block of keys ``k [BK, 512]`` (``valid [BK]``) into the online softmax: ``(m_i, l_i,
    acc)`` after it (log2 units). ``FIRST``: the split's first block (``m_i`` -inf, ``l_i`` and
    ``acc`` 0), so nothing is rescaled: the same values, 64 fewer multiplies a thread.
    ``KEYS_A``: the keys the A operand of both dots, so the scores are ``[BK, HT]`` and ``acc``
    is transposed, ``[512, HT]`` (one shared-memory copy of the keys, fewer registers)."""
    H_AX: tl.constexpr = 1 if KEYS_A else 0  # the heads' axis of the scores
    K_AX: tl.constexpr = 1 - H_AX  # the keys' axis
    if DOT_BF16:
        k = k.to(tl.bfloat16)  # exact: e4m3 * 2^e and bf16 rope dims
    if KEYS_A:
        s = _scores_tl(k, q, QK_SPLIT, DOT_BF16)
    else:
        s = _scores_tl(q, k, QK_SPLIT, DOT_BF16)
    s = tl.where(tl.expand_dims(valid, H_AX), s * qk_scale, -float("inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=K_AX))
    m_ref = tl.where(m_new == -float("inf"), 0.0, m_new)  # no key yet: keep exp2 finite
    p = tl.exp2(s - tl.expand_dims(m_ref, K_AX))
    if FIRST:
        l_i = tl.sum(p, axis=K_AX)
    else:
        alpha = tl.exp2(m_i - m_ref)
        l_i = l_i * alpha + tl.sum(p, axis=K_AX)
        acc = acc * tl.expand_dims(alpha, K_AX)
    if DOT_BF16:
        p_hi = p.to(tl.bfloat16)
        p_lo = (p - p_hi.to(tl.float32)).to(tl.bfloat16)
        if KEYS_A:
            acc = tl.dot(tl.trans(k), p_hi, acc)
            acc = tl.dot(tl.trans(k), p_lo, acc)
        else:
            acc = tl.dot(p_hi, k, acc)
            acc = tl.dot(p_lo, k, acc)
    elif KEYS_A:
        acc = tl.dot(tl.trans(k), p, acc, input_precision="ieee")
    else:
        acc = tl.dot(p, k, acc, input_precision="ieee")
    return m_new, l_i, acc


@triton.jit(do_not_specialize=["window_slots", "compressed_slots", "max_pos"])
def mega_attention_kernel(
    q_ptr, pos_ptr, table_ptr, win_ptr, comp_ptr, sink_ptr, cos_ptr, sin_ptr,
    xo_ptr, codes_ptr, lse_ptr, part_o_ptr, part_stat_ptr,
    window_slots, compressed_slots, max_pos, qk_scale,
    H: tl.constexpr, G: tl.constexpr, KEYS: tl.constexpr, FMT: tl.constexpr,
    WIN_BLOCK: tl.constexpr, COMP_BLOCK: tl.constexpr, HT: tl.constexpr, BK: tl.constexpr,
    KEYS_PER_SPLIT: tl.constexpr, SPLITS: tl.constexpr, DOT_BF16: tl.constexpr,
    USE_PDL: tl.constexpr = False, EARLY: tl.constexpr = False, ALIGNED: tl.constexpr = False,
    PREFETCH: tl.constexpr = False, SPLIT_PAD: tl.constexpr = 1, QK_SPLIT: tl.constexpr = 1,
    trace_ptr=None, TRACE: tl.constexpr = False, xo_deq_ptr=None, XO_DEQ: tl.constexpr = False,
    KEYS_A: tl.constexpr = False,
):  # fmt: skip
    """Heads ``tile * HT ..`` of token ``pid(0) // tiles`` over keys ``pid(1) * KEYS_PER_SPLIT ..``:
    the finished xo (one split) or fp32 partials for the combine.

    ``EARLY`` (a split of one key block whose records no kernel still running writes): the
    block is read before the PDL wait, so only q's read waits for wq_b. ``PREFETCH`` (a split of
    several blocks, aligned rows, GPU only): the split's records are asked of the L2 first.
    ``TRACE``: this program's stamps (``TRACE_FIELDS``) in ``trace_ptr``'s row."""
    if TRACE:
        row = tl.program_id(0).to(tl.int64) * SPLITS + tl.program_id(1)
        stamps = trace_ptr + row * _TRACE_FIELDS
        _stamp_now_tl(stamps, 0, tl.program_id(0))
        tl.store(stamps + 1, 0)
    TILES: tl.constexpr = (H + HT - 1) // HT
    pid = tl.program_id(0)
    split = tl.program_id(1)
    token = pid // TILES
    heads = (pid % TILES) * HT + tl.arange(0, HT)
    head_ok = heads < H
    d = tl.arange(0, _HEAD_DIM)
    # Before the PDL wait, what no step kernel writes: the position, its RoPE angles (q's, and
    # o's in the one-split epilogue) and the sink logits (used by that epilogue only).
    pos = tl.load(pos_ptr + token).to(tl.int64)
    cos_a, sin_a = _rope_angles_tl(0, pos, max_pos, cos_ptr, sin_ptr, _HEAD_DIM)
    sink = tl.load(sink_ptr + heads, mask=head_ok, other=0.0)
    if EARLY:
        tl.static_assert(KEYS_PER_SPLIT == BK, "an early split is one key block")
        k_early, valid_early = _key_block_tl(table_ptr + token.to(tl.int64) * KEYS, split * BK,
                                             win_ptr, comp_ptr, window_slots, compressed_slots,
                                             KEYS, FMT, WIN_BLOCK, COMP_BLOCK, BK,
                                             ALIGNED)  # fmt: skip
        if TRACE:
            _stamp_tl(stamps, 1, k_early)
        if DOT_BF16:  # the dot's bf16 keys made before the wait too (exact, as in _key_step_tl)
            k_early = k_early.to(tl.bfloat16)
    pdl_prologue_tl(USE_PDL)
    if TRACE:
        _stamp_now_tl(stamps, 2, pid)
    if PREFETCH:
        tl.static_assert(ALIGNED and not EARLY, "a bulk prefetch takes 16-B aligned rows")
        ahead = record_row_ptrs_tl(table_ptr + token.to(tl.int64) * KEYS, split * KEYS_PER_SPLIT,
                                   win_ptr, comp_ptr, window_slots, compressed_slots, KEYS, FMT,
                                   WIN_BLOCK, COMP_BLOCK, KEYS_PER_SPLIT, SPLIT_PAD)  # fmt: skip
        prefetch_records_tl(ahead[0], ahead[1], ahead[2], FMT)

    # q from the fused Q layout: standard[h * 512 + d] at (d // 16) * H * 16 + h * 16 + d % 16.
    q = _load_q_tl(q_ptr, token, (pid % TILES) * HT, H, HT)
    if TRACE:  # the cycles when q's raw load arrived
        tl.store(stamps + _Q_LOADED, clock64_tl(_arrived_tl(q)))
    q = _rope_tl(q, cos_a, sin_a, HT, _HEAD_DIM, False)
    if DOT_BF16:  # the GPU's cast rounds to nearest even
        q = q.to(tl.bfloat16)
    else:  # the interpreter's cast truncates
        q = bf16_round_tl(q)
    if TRACE:
        _stamp_tl(stamps, 3, q.to(tl.float32))

    m_i = tl.full((HT,), -float("inf"), tl.float32)  # running max of s * log2(e)
    l_i = tl.zeros((HT,), tl.float32)
    acc = tl.zeros((HT, _HEAD_DIM), tl.float32)
    if EARLY:  # the split's one block, read before the wait
        if TRACE:  # its scores (the same dot as the step's; the compiler makes it once)
            _stamp_tl(stamps, 7, _scores_tl(q, k_early, QK_SPLIT, DOT_BF16))
        m_i, l_i, acc = _key_step_tl(q, k_early, valid_early, m_i, l_i, acc, qk_scale, QK_SPLIT,
                                     DOT_BF16, True)  # fmt: skip
    else:
        table_row = table_ptr + token.to(tl.int64) * KEYS
        end = KEYS  # a split of no whole blocks of BK keys stops its last block at its end
        if KEYS_PER_SPLIT % BK != 0:
            end = tl.minimum((split + 1) * KEYS_PER_SPLIT, KEYS)
        if KEYS_A:  # acc transposed in the loop
            acc = tl.zeros((_HEAD_DIM, HT), tl.float32)
        for k0 in range(split * KEYS_PER_SPLIT, (split + 1) * KEYS_PER_SPLIT, BK):
            k, valid = _key_block_tl(table_row, k0, win_ptr, comp_ptr, window_slots,
                                     compressed_slots, end, FMT, WIN_BLOCK, COMP_BLOCK, BK,
                                     ALIGNED)  # fmt: skip
            m_i, l_i, acc = _key_step_tl(q, k, valid, m_i, l_i, acc, qk_scale, QK_SPLIT,
                                         DOT_BF16, False, KEYS_A)  # fmt: skip
        if KEYS_A:
            acc = tl.trans(acc)
    if TRACE:
        _stamp_tl(stamps, 4, acc)

    if SPLITS == 1:
        _epilogue_tl(
            acc, l_i, m_i, 0, token, heads, head_ok, sink, cos_a, sin_a, xo_ptr, codes_ptr,
            lse_ptr, xo_deq_ptr, H, G, HT, _HEAD_DIM, DOT_BF16, XO_DEQ,
        )  # fmt: skip
    else:
        # Partials of (token, tile) `pid`, split `split`: o [HT, 512] and (max, sum) [2, HT].
        hh = tl.arange(0, HT)
        at = pid.to(tl.int64) * SPLITS + split
        tl.store(part_o_ptr + (at * HT + hh[:, None]) * _HEAD_DIM + d[None, :], acc)
        tl.store(part_stat_ptr + at * (2 * HT) + hh, m_i)
        tl.store(part_stat_ptr + at * (2 * HT) + HT + hh, l_i)
    if TRACE:
        _stamp_now_tl(stamps, 5, pid)
        tl.store(stamps + 6, smid_tl(pid).to(tl.int64))


@triton.jit
def _split_rows_tl(part_o_ptr, part_stat_ptr, pid, t0, hh, cols, HT: tl.constexpr,
                   SPLITS: tl.constexpr, N: tl.constexpr, PAD: tl.constexpr):  # fmt: skip
    """Splits ``t0 .. t0 + N`` (padded to ``PAD``, masked) of (token, tile) ``pid``: their maxes
    and sums ``[PAD, heads]`` and o partials ``[PAD, heads, dims]``, one load each."""
    t = t0 + tl.arange(0, PAD)
    t_ok = t < t0 + N
    first = pid.to(tl.int64) * SPLITS + t  # each split's row of partials
    stat = part_stat_ptr + first[:, None] * (2 * HT) + hh[None, :]
    part = part_o_ptr + ((first[:, None] * HT + hh[None, :]) * _HEAD_DIM)[:, :, None] + cols
    m_t = tl.load(stat, mask=t_ok[:, None], other=-float("inf"))
    l_t = tl.load(stat + HT, mask=t_ok[:, None], other=0.0)
    o_t = tl.load(part, mask=t_ok[:, None, None], other=0.0)
    return m_t, l_t, o_t


@triton.jit
def _weighted_sums_tl(m_t, l_t, o_t, m_ref):
    """``(sum w o, sum w l)`` over ``_split_rows_tl``'s splits, each weighted by ``w = 2^(its
    max - m_ref)`` (0 for a padded split and one without keys)."""
    w = tl.exp2(m_t - m_ref[None, :])
    return tl.sum(w[:, :, None] * o_t, axis=0), tl.sum(w * l_t, axis=0)


@triton.jit
def _combine_wide_tl(part_o_ptr, part_stat_ptr, pid, hh, d0, HT: tl.constexpr,
                     SPLITS: tl.constexpr, W: tl.constexpr, HEAD: tl.constexpr,
                     TAIL: tl.constexpr):  # fmt: skip
    """The combine's sums ``(acc [CH, W], l_i [CH], m_i [CH])`` of heads ``hh``, dims ``d0 ..``
    of (token, tile) ``pid`` from every split's (max, sum) and o partial, ``[splits, heads(,
    dims)]``, all loads in flight at once; each split weighted by 2^(its max - the common max),
    summed over the splits. The splits come as a power of two ``HEAD`` and the rest padded to
    ``TAIL`` (0: none), a load each, so no more than ``TAIL - (SPLITS - HEAD)`` padded rows are
    read and summed (40 splits: 32 + 8, none, where one padded load took 64)."""
    cols = d0 + tl.arange(0, W)
    m_t, l_t, o_t = _split_rows_tl(part_o_ptr, part_stat_ptr, pid, 0, hh, cols, HT, SPLITS, HEAD,
                                   HEAD)  # fmt: skip
    if TAIL > 0:
        m_u, l_u, o_u = _split_rows_tl(part_o_ptr, part_stat_ptr, pid, HEAD, hh, cols, HT,
                                       SPLITS, SPLITS - HEAD, TAIL)  # fmt: skip
        m_i = tl.maximum(tl.max(m_t, axis=0), tl.max(m_u, axis=0))
    else:
        m_i = tl.max(m_t, axis=0)
    m_ref = tl.where(m_i == -float("inf"), 0.0, m_i)  # no key in any split: every weight is 0
    acc, l_i = _weighted_sums_tl(m_t, l_t, o_t, m_ref)
    if TAIL > 0:
        acc_u, l_u = _weighted_sums_tl(m_u, l_u, o_u, m_ref)
        acc += acc_u
        l_i += l_u
    return acc, l_i, m_i


@triton.jit(do_not_specialize=["max_pos"])
def mega_attention_combine_kernel(
    pos_ptr, sink_ptr, cos_ptr, sin_ptr, xo_ptr, codes_ptr, lse_ptr, part_o_ptr, part_stat_ptr,
    max_pos,
    H: tl.constexpr, G: tl.constexpr, HT: tl.constexpr, SPLITS: tl.constexpr, W: tl.constexpr,
    CH: tl.constexpr, USE_PDL: tl.constexpr = False, trace_ptr=None, TRACE: tl.constexpr = False,
    HW: tl.constexpr = False, SPLIT_HEAD: tl.constexpr = 1, SPLIT_TAIL: tl.constexpr = 0,
    WIDE: tl.constexpr = False, xo_deq_ptr=None, XO_DEQ: tl.constexpr = False,
):  # fmt: skip
    """Dims ``pid(1) * W ..`` of heads ``pid(2) * CH ..`` of (token, head tile) ``pid(0)``: the
    splits' partials rescaled to their common max and summed (in split order, or all read at
    once and summed as a tree: ``WIDE``, ``combine_wide``), then the epilogue.
    ``TRACE``: this program's stamps in ``trace_ptr``'s row (start, wait over, end, SM); ``HW``
    (the GPU): the bf16 round is the hardware's cast."""
    TILES: tl.constexpr = (H + HT - 1) // HT
    pid = tl.program_id(0)
    if TRACE:
        row = (pid * tl.num_programs(1) + tl.program_id(1)) * tl.num_programs(2) + tl.program_id(2)
        stamps = trace_ptr + row.to(tl.int64) * _TRACE_FIELDS
        _stamp_now_tl(stamps, 0, pid)
    d0 = tl.program_id(1) * W
    token = pid // TILES
    hh = tl.program_id(2) * CH + tl.arange(0, CH)  # heads of the tile
    heads = (pid % TILES) * HT + hh
    head_ok = heads < H
    # Before the PDL wait, what no step kernel writes: the sink logits, the position and the
    # RoPE angles of these dims.
    sink = tl.load(sink_ptr + heads, mask=head_ok, other=0.0)
    pos = tl.load(pos_ptr + token).to(tl.int64)
    c, s = _rope_angles_tl(d0, pos, max_pos, cos_ptr, sin_ptr, W)
    pdl_prologue_tl(USE_PDL)
    if TRACE:
        _stamp_now_tl(stamps, 2, pid)
    if WIDE:  # every split's (max, sum) and o partial in one load each, all in flight at once
        acc, l_i, m_i = _combine_wide_tl(part_o_ptr, part_stat_ptr, pid, hh, d0, HT, SPLITS, W,
                                         SPLIT_HEAD, SPLIT_TAIL)  # fmt: skip
    else:  # split by split: t's partials sit t * 2 HT and t * HT * 512 floats past split 0's
        first = pid.to(tl.int64) * SPLITS
        stats = part_stat_ptr + first * (2 * HT) + hh
        cols = d0 + tl.arange(0, W)
        parts = part_o_ptr + (first * HT + hh[:, None]) * _HEAD_DIM + cols[None, :]
        m_i = tl.full((CH,), -float("inf"), tl.float32)
        for t in tl.static_range(SPLITS):
            m_i = tl.maximum(m_i, tl.load(stats + t * (2 * HT)))
        m_ref = tl.where(m_i == -float("inf"), 0.0, m_i)  # no key in any split: every weight 0
        l_i = tl.zeros((CH,), tl.float32)
        acc = tl.zeros((CH, W), tl.float32)
        for t in tl.static_range(SPLITS):
            w = tl.exp2(tl.load(stats + t * (2 * HT)) - m_ref)
            l_i += w * tl.load(stats + (t * (2 * HT) + HT))
            acc += w[:, None] * tl.load(parts + t * (HT * _HEAD_DIM))
    _epilogue_tl(
        acc, l_i, m_i, d0, token, heads, head_ok, sink, c, s, xo_ptr, codes_ptr, lse_ptr,
        xo_deq_ptr, H, G, CH, W, HW, XO_DEQ,
    )  # fmt: skip
    if TRACE:
        _stamp_now_tl(stamps, 5, pid)
        tl.store(stamps + 6, smid_tl(pid).to(tl.int64))


def attention_alone(programs: int, sms: int, blocks_per_split: int = 1) -> bool:
    """Whether an attention launch of ``programs`` programs on ``sms`` SMs, each over
    ``blocks_per_split`` blocks of keys, holds each SM it runs on alone
    (``sm_share.launch_alone``): while it has at most ``sms // ALONE_SMS_SHARE`` programs, or
    ``sms // ALONE_SMS_SHARE_LONG`` of more than one block; never in the interpreter."""
    share = ALONE_SMS_SHARE_LONG if blocks_per_split > 1 else ALONE_SMS_SHARE
    return not interpreting() and programs <= int(sms // share)


def register_cap(registers: int) -> dict[str, int]:
    """The launch option capping a thread's registers at ``registers`` (0: none): NVIDIA's
    ``maxnreg`` where the platform compiles PTX, nothing elsewhere."""
    return {"maxnreg": registers} if registers and current_platform().ptx else {}


def split_pieces(splits: int) -> dict[str, int]:
    """The wide combine's loads of ``splits`` splits: a power of two (``SPLIT_HEAD``) and the
    rest padded to a power of two (``SPLIT_TAIL``, 0 when none is left)."""
    head = 1 << (splits.bit_length() - 1)
    tail = triton.next_power_of_2(splits - head) if splits > head else 0
    return {"SPLIT_HEAD": head, "SPLIT_TAIL": tail}


def combine_programs(heads: int) -> int:
    """Combine programs a (token, head tile) takes with ``heads`` heads a program."""
    return HEAD_DIM // COMBINE_CHUNK * (HEAD_TILE // heads)


def combine_wide(splits: int) -> bool:
    """Whether the combine reads every split's partials in one load each (``_combine_wide_tl``):
    from ``COMBINE_WIDE_SPLITS`` splits on."""
    return splits >= COMBINE_WIDE_SPLITS


def prefetch_records() -> bool:
    """Whether a split of several key blocks may ask the L2 for its records before its loop:
    where the platform has inline PTX (not on ROCm, nor under the interpreter, which has no L2)."""
    return current_platform().ptx


def score_segments(tiles: int) -> int:
    """Segments of the 512 dims the score dot is cut into (``_scores_tl``) for ``tiles`` (token,
    head tile) pairs: ``QK_SEGMENTS`` up to ``QK_SEGMENTS_TILES`` pairs and 1 above."""
    return QK_SEGMENTS if tiles <= QK_SEGMENTS_TILES else 1


def programs_per_sm(tiles: int) -> int:
    """Attention programs a SM the key splits aim at for ``tiles`` (token, head tile) pairs:
    the first of ``PROGRAM_TIERS`` (``ROCM_PROGRAM_TIERS`` on ROCm) that holds that many tiles."""
    tiers = ROCM_PROGRAM_TIERS if current_platform().kind == "rocm" else PROGRAM_TIERS
    return next(per_sm for most, per_sm in tiers if most is None or tiles <= most)


def head_tile_pairs(tokens: int, heads: int) -> int:
    """(token, head tile) pairs of ``tokens`` tokens over ``heads`` heads: the programs an
    attention launch has before its keys are split."""
    return tokens * -(-heads // HEAD_TILE)


def attention_splits(
    tokens: int, heads: int, keys: int, sms: int, per_sm: int | None = None
) -> tuple[int, int]:
    """``(splits, keys_per_split)``: split the keys (in ``KEY_BLOCK`` steps) until the attention
    launch has at most ``per_sm`` (default ``programs_per_sm``) programs a SM, one wave (at
    least, on ROCm; 1 split once the tokens alone fill the GPU)."""
    tiles = head_tile_pairs(tokens, heads)
    blocks = max(1, -(-keys // KEY_BLOCK))
    per_sm = programs_per_sm(tiles) if per_sm is None else per_sm
    if current_platform().kind == "rocm":
        wanted = min(blocks, max(1, -(-per_sm * sms // tiles)))
    else:
        wanted = min(blocks, max(1, per_sm * sms // tiles))
    return _even_splits(keys, wanted)


@dataclasses.dataclass(frozen=True)
class AttentionTuning:
    """An attention launch's choices (``attention_tuning`` resolves them for a step)."""

    splits: int  # key-table splits a (token, head tile)
    keys_per_split: int  # whole blocks of KEY_BLOCK keys (a last key_block may stop short)
    qk_split: int  # segments of the score dot: 1, 2, 4 or 8
    alone: bool  # programs hold their SMs alone (GPU only)
    combine_heads: int = COMBINE_HEADS  # heads a combine program finishes: 1, 2, 4, 8 or 16
    combine_wide: bool = False  # the combine reads every split's partials in one load each
    key_block: int = KEY_BLOCK  # keys a dot covers: 16 or 32
    # Registers a thread at most (0: the compiler's choice; NVIDIA only, ignored elsewhere): a
    # cap lets more programs share a SM (an A/B choice: SM90, M = 48, 16-key dots in 4
    # segments hold 168, 3 programs a SM, against 188, 2; no spill with Triton 3.6, 16 B 3.9)
    max_registers: int = 0
    # The keys the A operand of both dots (scores and output transposed; an A/B choice): one
    # shared-memory copy of a key block, not two (SM90, M = 48: 72 KB against 103, 230
    # registers against 243, 2,104 SASS instructions against 2,280; 16-key dots at 168
    # registers: 44 KB, so 3 programs a SM)
    keys_a: bool = False

    def __post_init__(self):
        checks = {
            "qk_split": (self.qk_split in (1, 2, 4, 8), "1, 2, 4 or 8"),
            "combine_heads": (self.combine_heads in (1, 2, 4, 8, 16), "1, 2, 4, 8 or 16"),
            "key_block": (self.key_block in KEY_BLOCKS, f"one of {KEY_BLOCKS}"),
            "max_registers": (self.max_registers == 0 or 64 <= self.max_registers <= 255,
                              "0 or 64 .. 255"),
            "splits": (self.splits >= 1 and self.keys_per_split % KEY_BLOCK == 0,
                       f"splits >= 1 of whole {KEY_BLOCK}-key blocks"),
        }  # fmt: skip
        for name, (ok, expected) in checks.items():
            if not ok:
                raise ValueError(f"AttentionTuning.{name}: expected {expected}, got {self}")


def attention_tuning(
    tokens: int, heads: int, keys: int, sms: int, splits: int | None = None
) -> AttentionTuning:
    """The launch choices for ``tokens`` tokens (a step passes its token bucket) over ``heads``
    heads and ``keys`` keys on ``sms`` SMs; ``splits`` overrides the split count."""
    blocks = max(1, -(-keys // KEY_BLOCK))
    if splits is None:
        splits, keys_per_split = attention_splits(tokens, heads, keys, sms)
    elif 1 <= splits <= blocks:
        splits, keys_per_split = _even_splits(keys, splits)
    else:
        raise ValueError(
            f"splits: expected 1 .. {blocks} (blocks of {KEY_BLOCK} keys), got {splits}"
        )
    tiles = head_tile_pairs(tokens, heads)
    return AttentionTuning(
        splits=splits,
        keys_per_split=keys_per_split,
        qk_split=score_segments(head_tile_pairs(bucket_for(tokens), heads)),
        alone=attention_alone(tiles * splits, sms, keys_per_split // KEY_BLOCK),
        combine_wide=combine_wide(splits),
        key_block=32 if tokens >= KEY_BLOCK_32_TOKENS else KEY_BLOCK,
    )


def _even_splits(keys: int, wanted: int) -> tuple[int, int]:
    """``wanted`` splits of the key table in whole key blocks -> ``(splits, keys_per_split)``."""
    keys_per_split = max(1, -(-keys // (wanted * KEY_BLOCK))) * KEY_BLOCK
    return max(1, -(-keys // keys_per_split)), keys_per_split


def _check(
    name: str, t: torch.Tensor, dtypes: tuple[torch.dtype, ...], shape: tuple[int, ...]
) -> None:
    if t.dtype not in dtypes or tuple(t.shape) != shape:
        want = " or ".join(str(x).removeprefix("torch.") for x in dtypes)
        raise ValueError(
            f"{name}: expected {want} {list(shape)}, "
            f"got {str(t.dtype).removeprefix('torch.')} {list(t.shape)}"
        )
    if not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor, got strides {t.stride()}")


def mega_attention(
    q_fused: torch.Tensor,
    positions: torch.Tensor,
    key_table: torch.Tensor,
    window_cache: PagedKVCache,
    compressed_cache: PagedKVCache | None,
    attn_sink: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    softmax_scale: float,
    heads_per_group: int = 8,
    splits: int | None = None,
    records_ready: bool = False,
    tuning: AttentionTuning | None = None,
    pdl: bool | None = None,
    xo_deq: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention of M tokens over their key tables -> ``(xo, xo_codes, lse)`` (module docstring).

    Arguments (``H`` = the rank's heads, ``M`` tokens, one device):

    - ``q_fused`` bf16 ``[M, H * 512]``: q in the fused Q layout, not yet RoPE'd;
    - ``positions`` int32 / int64 ``[M]``: each token's position (RoPE of q and o);
    - ``key_table`` int32 ``[M, KEYS]``: ``slot | 1 << 31`` a compressed-cache row, a
      window-cache slot otherwise; -1, and any entry outside its cache, is no key;
    - ``window_cache`` / ``compressed_cache``: paged record caches of one format
      (``compressed_cache`` None: no compressed entry is valid);
    - ``attn_sink`` fp32 ``[H]``: sink logit per head; -inf is no sink, +inf sends all
      weight to the sink (o = 0);
    - ``cos`` / ``sin`` fp32 ``[max_position, 32]``: the layer's RoPE tables;
    - ``splits``: key-table splits (whole blocks of 16 keys, so at most this many) a (token, head
      tile) uses; None picks enough to fill the GPU.
    - ``records_ready``: no kernel that may still run when this launch starts writes the
      caches (the caller ordered the record insert before it with a full stream dependency);
      a split of one key block then reads its keys before the PDL wait.
    - ``tuning`` (a step's ``Tuning`` passes it; ``splits`` is then ignored) and ``pdl``: None
      picks them for M (``attention_tuning``, ``pdl_enabled``);
    - ``xo_deq`` bf16 ``[M, H * 512]``: when given, receives xo's values dequantized (fused O
      layout), the activation of a wo_a whose MMA loop reads it so.

    Returns ``xo`` e4m3 ``[M, H * 512]`` in the fused O layout (per group g of
    ``heads_per_group`` heads: ``xo[m, g * G * 512 + (c * G + e) * 32 + j]`` is head
    ``g * G + e``, dim ``c * 32 + j``), ``xo_codes`` uint8 ``[M, H * 16]`` (its E8M0
    code at ``g * G * 16 + c * G + e``) and ``lse`` fp32 ``[M, H]`` (natural log,
    -inf for a head with no valid key, whose o is 0).
    """
    if q_fused.dim() != 2 or q_fused.shape[1] % HEAD_DIM:
        raise ValueError(
            f"q_fused: expected bfloat16 [M, heads * {HEAD_DIM}], "
            f"got {q_fused.dtype} {list(q_fused.shape)}"
        )
    tokens, heads = q_fused.shape[0], q_fused.shape[1] // HEAD_DIM
    device = q_fused.device
    _check("q_fused", q_fused, (torch.bfloat16,), (tokens, heads * HEAD_DIM))
    _check("positions", positions, (torch.int32, torch.int64), (tokens,))
    if key_table.dim() != 2:
        raise ValueError(
            f"key_table: expected int32 [M, KEYS], got {key_table.dtype} {list(key_table.shape)}"
        )
    _check("key_table", key_table, (torch.int32,), (tokens, key_table.shape[1]))
    _check("attn_sink", attn_sink, (torch.float32,), (heads,))
    _check("cos", cos, (torch.float32,), (cos.shape[0], ROPE_DIM // 2))
    _check("sin", sin, (torch.float32,), tuple(cos.shape))
    if xo_deq is not None:
        _check("xo_deq", xo_deq, (torch.bfloat16,), (tokens, heads * HEAD_DIM))
    if heads_per_group <= 0 or heads % heads_per_group:
        raise ValueError(
            f"heads_per_group: expected a divisor of the {heads} heads, got {heads_per_group}"
        )
    if compressed_cache is not None and compressed_cache.fmt != window_cache.fmt:
        raise ValueError(
            f"compressed_cache: expected the window cache's record format {window_cache.fmt.name}, "
            f"got {compressed_cache.fmt.name}"
        )
    named = {"positions": positions, "key_table": key_table, "attn_sink": attn_sink, "cos": cos,
             "sin": sin, "window_cache": window_cache.data}  # fmt: skip
    if compressed_cache is not None:
        named["compressed_cache"] = compressed_cache.data
    for name, t in named.items():
        if t.device != device:
            raise ValueError(
                f"{name}: expected a tensor on {device} (q_fused's device), got {t.device}"
            )

    keys = key_table.shape[1]
    if tuning is None:
        tuning = attention_tuning(tokens, heads, keys, sm_count(device), splits)
    splits, keys_per_split = tuning.splits, tuning.keys_per_split
    if keys > splits * keys_per_split:
        raise ValueError(f"tuning: {splits} splits of {keys_per_split} keys do not cover the "
                         f"{keys} keys of key_table")  # fmt: skip
    tiles = head_tile_pairs(tokens, heads)
    xo = torch.empty(tokens, heads * HEAD_DIM, dtype=E4M3, device=device)
    xo_codes = torch.empty(tokens, heads * HEAD_DIM // MX_BLOCK, dtype=torch.uint8, device=device)
    lse = torch.empty(tokens, heads, dtype=torch.float32, device=device)
    if tokens == 0:
        return xo, xo_codes, lse
    parts = tiles * splits * HEAD_TILE if splits > 1 else 0
    part_o = torch.empty(parts, HEAD_DIM, dtype=torch.float32, device=device)
    part_stat = torch.empty(2 * parts, dtype=torch.float32, device=device)
    comp = compressed_cache if compressed_cache is not None else window_cache
    xo_bytes = xo.view(torch.uint8)
    pdl = pdl_enabled(tokens) if pdl is None else pdl and current_platform().pdl
    early = records_ready and keys_per_split == tuning.key_block
    aligned = rows_aligned(window_cache, comp)
    trace = trace_buffer
    ch = tuning.combine_heads
    programs = tiles * splits + (tiles * combine_programs(ch) if splits > 1 else 0)
    if trace is not None and (trace.dtype != torch.int64 or trace.device != device
                              or trace.shape[0] < programs
                              or tuple(trace.shape[1:]) != (TRACE_FIELDS,)):  # fmt: skip
        raise ValueError(f"mega_attention.trace_buffer: expected int64 [>= {programs}, "
                         f"{TRACE_FIELDS}] on {device}, got {trace.dtype} {list(trace.shape)} "
                         f"on {trace.device}")  # fmt: skip
    if trace is not None and not current_platform().ptx:
        raise ValueError(f"mega_attention.trace_buffer: the trace reads NVIDIA's PTX timers, "
                         f"got {current_platform().features}")  # fmt: skip
    launch_alone(
        mega_attention_kernel, (tiles, splits), tuning.alone and not interpreting(), device,
        q_fused, positions, key_table, window_cache.data, comp.data, attn_sink, cos, sin,
        xo_bytes, xo_codes, lse, part_o, part_stat,
        window_cache.num_slots, 0 if compressed_cache is None else compressed_cache.num_slots,
        cos.shape[0], softmax_scale * LOG2_E,
        H=heads, G=heads_per_group, KEYS=keys, FMT=fmt_id(window_cache.fmt),
        WIN_BLOCK=window_cache.block, COMP_BLOCK=comp.block, HT=HEAD_TILE, BK=tuning.key_block,
        KEYS_PER_SPLIT=keys_per_split, SPLITS=splits, DOT_BF16=not interpreting(),
        EARLY=early, num_warps=ATTN_WARPS, USE_PDL=pdl, ALIGNED=aligned,
        PREFETCH=aligned and not early and keys_per_split > tuning.key_block
        and prefetch_records(),
        SPLIT_PAD=triton.next_power_of_2(keys_per_split),
        QK_SPLIT=tuning.qk_split,
        trace_ptr=lse if trace is None else trace, TRACE=trace is not None,
        xo_deq_ptr=lse if xo_deq is None else xo_deq, XO_DEQ=xo_deq is not None,
        KEYS_A=tuning.keys_a and not early,
        **register_cap(tuning.max_registers), **pdl_launch_options(pdl),
    )  # fmt: skip
    if splits > 1:
        grid = (tiles, HEAD_DIM // COMBINE_CHUNK, HEAD_TILE // ch)
        mega_attention_combine_kernel[grid](
            positions, attn_sink, cos, sin, xo_bytes, xo_codes, lse, part_o, part_stat,
            cos.shape[0],
            H=heads, G=heads_per_group, HT=HEAD_TILE, SPLITS=splits, W=COMBINE_CHUNK,
            CH=ch, num_warps=4, USE_PDL=pdl, HW=not interpreting(),
            **split_pieces(splits), WIDE=tuning.combine_wide,
            trace_ptr=lse if trace is None else trace[tiles * splits:], TRACE=trace is not None,
            xo_deq_ptr=lse if xo_deq is None else xo_deq, XO_DEQ=xo_deq is not None,
            **pdl_launch_options(pdl),
        )  # fmt: skip
    return xo, xo_codes, lse
