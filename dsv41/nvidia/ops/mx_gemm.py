"""MXFP8 GEMM for small M: ``out = dequant(a8) @ dequant(w)^T``, fp32 accumulate, bf16 out.

docs/design.md §2 and §3.

One kernel serves every projection of the step. The weight is e4m3 ``[N, K]``
with per-row E8M0 codes ``[N, K / 32]`` (``LayerWeights``); the activation
``a`` reaches the dot as the exact value of its MXFP8 form, from one of three
prologues (``A_MODE``):

- ``A_MX``: e4m3 values ``[M, K]`` and codes ``[M, K / 32]`` (qr8, xo, z8);
- ``A_CAST``: bf16 ``[M, K]`` cast to MXFP8 in the prologue (x for Wqkv);
- ``A_O``: a bf16 standard-layout attention output ``o [M, heads, 512]`` read
  through the fused O layout of ``wo_a``'s columns, inverse-RoPE'd at the
  token's position, rounded to bf16 and cast to MXFP8 (the fused WO-A kernel);
- ``A_NORM`` (CUDA-core loop only): bf16 ``qr [M, K]``, RMS-normalised over its
  K columns, times the norm weight, rounded to bf16 and cast to MXFP8: wq_b's
  activation straight from the Wqkv output, as ``norm_rope_insert`` makes it;
- ``A_DEQ`` (MMA loop only): bf16 ``[M, G K]`` holding an MXFP8 activation's values
  already dequantized by the launch that made it (``Dequantized``; exact: an e4m3 value
  times a power of two), the dot's operand as read, so the loop converts only weights.

Grouped GEMMs (``wo_a``) give each group of ``N_PER_GROUP`` output rows its
own ``K`` columns of ``a``: ``out[:, g * Ng + n] = a[:, g * K : (g + 1) * K] @
w[g * Ng + n]``. At M <= 48 the GEMM is a weight stream, so the grid is
``(N / BLOCK_N) x SPLIT_K`` programs (>= ~2 a SM); with ``SPLIT_K > 1`` each
program writes an fp32 partial and the last of a tile's programs to arrive
(an acq_rel ticket that it resets, so the launch is CUDA-graph safe) sums the
partials in split order and runs the epilogue: bf16 out and, with
``QUANT_OUT``, the MXFP8 cast of that bf16 tile (``BLOCK_N`` a multiple of 32).
Products of MXFP8 values are exact in bf16 and tf32, so the dot runs on bf16
operands on the GPU and on fp32 operands under the interpreter (whose bf16
dot is broken); both accumulate in fp32. Buckets up to ``GEMV_MAX_M`` (two tokens)
take a CUDA-core loop instead (``GEMV``): one weight tile a program, loaded
before the PDL wait, fp32 FMAs, no MMA tile padded to 16 rows (a config may give
a program ``k_steps`` tiles along K, unrolled: with ``split_k = 1`` no partial
sums at all; ``profile_step.py --sweep`` times those). At one token a K past
``GEMV_BLOCK_K_MAX`` or no power of two takes whole rows as a power-of-two tile
and a tail (``k_tail``), both loaded before the PDL wait. With ``a8_out`` the
A_CAST prologue's MXFP8 form of ``a`` is stored too (by the first N tile's
programs): wo_b casting z, so that wo_a needs no MXFP8 epilogue. In steps of up to
``PRELOAD_MAX_M`` tokens where PDL is on and the grids fit one wave, an MMA program takes one
K step (``preload``), its weight tile read before the PDL wait, so the weights stream while
the previous launch drains.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import triton
import triton.language as tl

from dsv41.common.mx import (
    E4M3,
    MX_BLOCK,
    bf16_rn_tl,
    bf16_round_tl,
    code_rows_tl,
    e8m0_scale_tl,
    mx_dequantize_tl,
    mx_parts_tl,
    mx_quantize_tl,
    mx_round_tl,
)
from dsv41.common.norm_tl import rms_factor_of_tl, rms_factor_tl
from dsv41.common.platform import current_platform
from dsv41.common.rope import rope_pair_tl
from dsv41.common.timer_tl import globaltimer_tl, smid_tl
from dsv41.nvidia.ops.launch import bucket_for, interpreting, sm_count
from dsv41.nvidia.ops.pdl import pdl_enabled, pdl_launch_options, pdl_prologue_tl
from dsv41.nvidia.ops.record_prefetch import RecordsAhead, prefetch_share_tl

A_MX = tl.constexpr(0)  # a is MXFP8 values + codes
A_CAST = tl.constexpr(1)  # a is bf16, cast to MXFP8 in the prologue
A_O = tl.constexpr(2)  # a is a standard-layout bf16 o: inverse RoPE + fused O columns + cast
A_NORM = tl.constexpr(3)  # a is bf16 qr: RMSNorm * weight, bf16, cast (the CUDA-core loop)
A_DEQ = tl.constexpr(4)  # a is bf16 MXFP8 values, dequantized by their producer (the MMA loop)
_MX = tl.constexpr(MX_BLOCK)  # 32
O_CHUNK = 32  # head dims per fused O chunk (one MX block)
_O_CHUNK = tl.constexpr(O_CHUNK)
# Where PDL is on (NVIDIA), a step of up to PRELOAD_MAX_M tokens whose every GEMM fits one wave of
# at most PRELOAD_PROGRAMS_PER_SM programs a SM takes the MMA loop of one K step of at most
# PRELOAD_BLOCK_K columns a program, its weight tile read before the PDL wait, so the weights
# stream while the previous launch drains (H100, PDL on to 8 tokens, tp 4 (<= 640 programs):
# M = 4 3.57x / 3.62x the floor against 4.31x / 4.33x, M = 8 4.30x / 4.31x against 4.56x /
# 4.62x; tp 2 (1,280 programs): 3.32x / 3.69x against 3.11x / 3.28x; at M = 16 no gain).
PRELOAD_MAX_M = 8
PRELOAD_BLOCK_K = 256
PRELOAD_PROGRAMS_PER_SM = 5
PROGRAMS_PER_SM = 1.5  # a weight stream needs loads in flight on every SM (H200 sweep: 1.5-2 best)
BLOCK_K_MAX = 256  # K columns a step loads: 16 KB of a 64-row weight tile
# The A_O prologue holds a gathered o tile and its RoPE operands: 128 columns keep it in
# registers (256 spills at 32 tokens on SM90).
MIN_BLOCK_K = 128  # below this a step's loads are too short to stream well
O_PROLOGUE_BLOCK_K = 128
# K columns a step of the MMA loop loads on ROCm: with 256, the 32-row tiles of gfx942 hold 256
# VGPRs + 256 AGPRs a lane and spill (kernel_facts --target gfx942 --tp 1 --tokens 32: 12-14
# VGPR, ~260 SGPR spills a GEMM); 128 spills nothing there.
ROCM_BLOCK_K_MAX = 128
# The CUDA-core loop (GEMV) serves token buckets up to GEMV_MAX_M; each program's first weight
# tile is in flight before the PDL wait. Where whole rows of K fit GEMV_TILE_BYTES in at most
# GEMV_MAX_STEPS unrolled K steps, a program takes whole rows: no split-K partials, ticket or
# second pass. Otherwise tiles of GEMV_SPLIT_TILE_BYTES (>= 8 rows, >= 32 for z's MX cast)
# split K. Whole rows beat split K for each GEMM alone on the H200 (wq_b 7.60 against 8.83 us);
# in the step only a program's first K step is loaded before the wait, so one step a tile.
# With the tile's MX blocks outermost (_gemv_tile) and PDL the loop beats the MMA loop at two
# tokens (tp 4: 41.6 against 56.4 us) but not at four (65.1 against 60.3): GEMV_MAX_M = 2.
GEMV_MAX_M = 2
GEMV_TILE_BYTES = 16384
GEMV_SPLIT_TILE_BYTES = 8192
GEMV_QUANT_TILE_BYTES = 8192  # the same for wo_a, which casts its output
GEMV_BLOCK_K_MAX = 2048
GEMV_BLOCK_N = (8, 64)  # rows of a split-K tile, least and most
GEMV_MAX_STEPS = 1  # unrolled K steps of a whole-row tile
# One token, whole rows of Wqkv's 5120 / wq_b's 1280 columns as 4096 + 1024 / 1024 + 256 (and
# wo_a's 4096 when z is cast in wo_b), both loaded before the PDL wait: no split-K sum (0: off).
# 32 KB tiles were faster than split K on the H200 (tp 4, M = 1: 29.5 against 30.3 to 31.0 us);
# 16 KB tiles took Wqkv past one wave of programs.
GEMV_TAIL_BYTES = 32768
TRACE_FIELDS = 5  # a traced program's start, PDL wait over, end (ns), SM and K loop done (ns)
_TRACE_FIELDS = tl.constexpr(TRACE_FIELDS)
GEMV_WIDE_STEP = 8192  # weight bytes a K step above which a program runs 8 warps, not 4


@triton.jit
def _mx_load(v_ptr, c_ptr, rows, row_ok, stride_v, stride_c, k0, BLOCK_K: tl.constexpr,
             WORDS: tl.constexpr = False):  # fmt: skip
    """MXFP8 ``rows`` x columns ``k0 .. k0 + BLOCK_K`` as read: e4m3 values and int32 codes
    ``[R, BLOCK_K / 32]``. ``WORDS`` (4-B aligned code rows, ``k0`` a multiple of 128): the
    codes read as int32 words, so a loop's pipeliner copies them ahead with the values (it
    takes no 1-B loads)."""
    k = k0 + tl.arange(0, BLOCK_K)
    v = tl.load(v_ptr + rows[:, None] * stride_v + k[None, :], mask=row_ok[:, None], other=0.0)
    c = code_rows_tl(c_ptr + rows.to(tl.int64) * stride_c + k0 // _MX, row_ok, BLOCK_K // _MX,
                     WORDS)  # fmt: skip
    return v, c


@triton.jit
def _mx_tile(
    v_ptr, c_ptr, rows, row_ok, stride_v, stride_c, k0, BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr, WORDS: tl.constexpr = False,
):  # fmt: skip
    """``values * 2^(code - 127)`` of MXFP8 ``rows`` x columns ``k0 .. k0 + BLOCK_K``, fp32
    (``_mx_load``)."""
    v, c = _mx_load(v_ptr, c_ptr, rows, row_ok, stride_v, stride_c, k0, BLOCK_K, WORDS)
    return mx_dequantize_tl(v, c, BLOCK_R, BLOCK_K)


@triton.jit
def _mma_act(a_ptr, a_codes_ptr, pos_ptr, cos_ptr, sin_ptr, rows, row_ok, stride_am, stride_acm,
             group, k0, K: tl.constexpr, A_MODE: tl.constexpr, DOT_BF16: tl.constexpr,
             G: tl.constexpr, HEAD_DIM: tl.constexpr, NOPE: tl.constexpr,
             HALF_ROPE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    """The MMA loop's activation ``[BLOCK_M, BLOCK_K]`` at columns ``k0`` of group ``group``:
    the exact values of its MXFP8 form, as its ``A_MODE`` prologue makes them."""
    k = k0 + tl.arange(0, BLOCK_K)
    if A_MODE == A_MX:
        a = _mx_tile(a_ptr, a_codes_ptr, rows, row_ok, stride_am, stride_acm, group * K + k0,
                     BLOCK_M, BLOCK_K)  # fmt: skip
    elif A_MODE == A_DEQ:  # the dot's operand as read (bf16 on the GPU)
        a = tl.load(a_ptr + rows[:, None] * stride_am + (group * K + k)[None, :],
                    mask=row_ok[:, None], other=0.0)  # fmt: skip
        if not DOT_BF16:
            a = a.to(tl.float32)
    elif A_MODE == A_CAST:
        x = tl.load(a_ptr + rows[:, None] * stride_am + k[None, :], mask=row_ok[:, None],
                    other=0.0)  # fmt: skip
        a = mx_round_tl(x.to(tl.float32), BLOCK_M, BLOCK_K)
    else:
        o = o_fused_tile_tl(a_ptr, pos_ptr, cos_ptr, sin_ptr, rows, k0, group, row_ok, stride_am,
                            G, HEAD_DIM, NOPE, HALF_ROPE, BLOCK_M, BLOCK_K)  # fmt: skip
        a = mx_round_tl(o, BLOCK_M, BLOCK_K)
    return a


@triton.jit
def _mma_tl(acc, a, w, WEIGHTS_A: tl.constexpr, DOT_BF16: tl.constexpr):
    """``acc + a [BM, BK] @ w [BN, BK]^T``, or with ``WEIGHTS_A`` the transposed ``acc + w @
    a^T`` ``[BN, BM]`` (the weights the MMA's A operand: 64 weight rows fill SM90's warpgroup
    MMA, which takes A from registers); bf16 operands on the GPU, IEEE fp32 under the
    interpreter."""
    if DOT_BF16:
        a = a.to(tl.bfloat16)
        w = w.to(tl.bfloat16)
    if WEIGHTS_A:
        x = w
        y = tl.trans(a)
    else:
        x = a
        y = tl.trans(w)
    if DOT_BF16:
        return tl.dot(x, y, acc)
    return tl.dot(x, y, acc, input_precision="ieee")


@triton.jit
def _gemv_tile(w_ptr, w_codes_ptr, n64, n_ok, k0, K: tl.constexpr, BLOCKS: tl.constexpr):
    """The CUDA-core loop's weight tile at ``k0``: e4m3 ``[BLOCKS, BLOCK_N, 32]``, its codes
    ``[BLOCKS, BLOCK_N]`` and the columns ``[BLOCKS, 32]`` it covers. Blocks outermost: a
    thread then holds one block's columns of several rows, so a token's activation values
    are shared by those rows in registers."""
    blk = tl.arange(0, BLOCKS)
    col = (blk * _MX + k0)[:, None] + tl.arange(0, _MX)[None, :]
    w8 = tl.load(w_ptr + n64[None, :, None] * K + col[:, None, :], mask=n_ok[None, :, None],
                 other=0.0)  # fmt: skip
    wc = tl.load(w_codes_ptr + n64[None, :] * (K // _MX) + (blk + k0 // _MX)[:, None],
                 mask=n_ok[None, :], other=0)  # fmt: skip
    return w8, wc, col


@triton.jit
def _gemv_norm_weight(norm_ptr, col, A_MODE: tl.constexpr):
    """A_NORM: the norm weight at the CUDA-core tile's columns ``col`` (bf16), read with the
    weight tile before the PDL wait (no step kernel writes it; a read after the wait would pay
    an HBM miss on the chain); else ``col`` itself, unused."""
    if A_MODE == A_NORM:
        g = tl.load(norm_ptr + col)
    else:
        g = col
    return g


@triton.jit
def _gemv_act_load(a_ptr, a_codes_ptr, row, stride_am, stride_acm, group, k0, col,
                   K: tl.constexpr, BLOCKS: tl.constexpr, A_MODE: tl.constexpr):  # fmt: skip
    """Token ``row``'s activation at the CUDA-core tile's columns ``col [BLOCKS, 32]`` (from
    ``k0``) as read: fp32 ``[BLOCKS, 32]`` (e4m3 values for A_MX, else bf16 x or qr) and, for
    A_MX, its E8M0 codes ``[BLOCKS]`` (else ``col``, unused)."""
    if A_MODE == A_MX:
        x = tl.load(a_ptr + row * stride_am + group * K + col).to(tl.float32)
        codes = tl.load(a_codes_ptr + row * stride_acm + (group * K + k0) // _MX
                        + tl.arange(0, BLOCKS))  # fmt: skip
    else:
        x = tl.load(a_ptr + row * stride_am + col).to(tl.float32)
        codes = col
    return x, codes


@triton.jit
def _gemv_act_cast(x, codes, g, rms, BLOCKS: tl.constexpr, A_MODE: tl.constexpr,
                   HW_E4M3: tl.constexpr):  # fmt: skip
    """``_gemv_act_load``'s activation as its prologue makes it, in two fp32 parts: e4m3
    values ``[BLOCKS, 32]`` and their block scales ``[BLOCKS]``. MXFP8 as read (A_MX), x cast
    to MXFP8 (A_CAST), or ``mxfp8(bf16(qr * rms * g))`` (A_NORM: ``rms`` the row's RMSNorm
    factor, ``g`` the norm weight at the tile's columns); ``HW_E4M3``: the cast rounds with the
    hardware's conversion."""
    if A_MODE == A_MX:
        values, scales = x, e8m0_scale_tl(codes.to(tl.int32))
    else:  # one MX block a row of the tile
        if A_MODE == A_NORM:
            x = bf16_rn_tl(x * rms * g.to(tl.float32), HW_E4M3)
        values, scales = mx_parts_tl(x, BLOCKS, _MX, HW_E4M3)
        scales = tl.reshape(scales, (BLOCKS,))
    return values, scales


@triton.jit
def _gemv_act(a_ptr, a_codes_ptr, g, row, stride_am, stride_acm, group, k0, col, rms,
              K: tl.constexpr, BLOCKS: tl.constexpr, A_MODE: tl.constexpr,
              HW_E4M3: tl.constexpr):  # fmt: skip
    """``_gemv_act_load`` then ``_gemv_act_cast``: (values ``[BLOCKS, 32]``, scales
    ``[BLOCKS]``)."""
    x, codes = _gemv_act_load(a_ptr, a_codes_ptr, row, stride_am, stride_acm, group, k0, col, K,
                              BLOCKS, A_MODE)  # fmt: skip
    return _gemv_act_cast(x, codes, g, rms, BLOCKS, A_MODE, HW_E4M3)


@triton.jit
def _gemv_dot_one(acc, w8, wc, values, scales):
    """``acc [1, BLOCK_N]`` plus one token's dots with the CUDA-core tile (``_gemv_act_cast``'s
    values and scales): each block's 32 exact products summed, weighted by both E8M0 scales."""
    part = tl.sum(w8.to(tl.float32) * values[:, None, :], axis=2)
    return acc + tl.sum(part * (e8m0_scale_tl(wc.to(tl.int32)) * scales[:, None]), axis=0)[None, :]


@triton.jit
def _gemv_rows(acc, w8, wc, col, a_ptr, a_codes_ptr, g, first, M, stride_am, stride_acm,
               group, k0, rms, K: tl.constexpr, BLOCKS: tl.constexpr, BLOCK_M: tl.constexpr,
               A_MODE: tl.constexpr, HW_E4M3: tl.constexpr):  # fmt: skip
    """``acc [BLOCK_M, BLOCK_N]`` plus the CUDA-core tile's dots with each token row ``first
    ..`` (``rms [BLOCK_M]``: A_NORM's factors): the tile converted to fp32 once, each block's
    32 products of e4m3 values summed (exact products), then weighted by both E8M0 scales."""
    token = tl.arange(0, BLOCK_M)
    ws = e8m0_scale_tl(wc.to(tl.int32))
    wf = w8.to(tl.float32)
    for r in tl.static_range(BLOCK_M):
        row = tl.minimum(first + r, M - 1)  # rows past M: stored nowhere
        a, sa = _gemv_act(a_ptr, a_codes_ptr, g, row, stride_am, stride_acm, group, k0, col,
                          tl.sum(tl.where(token == r, rms, 0.0)), K, BLOCKS, A_MODE,
                          HW_E4M3)  # fmt: skip
        dots = tl.sum(tl.sum(wf * a[:, None, :], axis=2) * (ws * sa[:, None]), axis=0)
        acc += tl.where(token[:, None] == r, dots[None, :], 0.0)
    return acc


@triton.jit
def _store_a8(x_ptr, v_ptr, c_ptr, first, M, stride_xm, stride_vm, stride_cm, k0,
              BLOCKS: tl.constexpr, BLOCK_M: tl.constexpr):  # fmt: skip
    """The MXFP8 form of bf16 ``x``'s token rows ``first ..`` (< M), columns ``k0 .. k0 +
    32 BLOCKS``, stored to values ``v`` and codes ``c`` (A8_OUT: the programs of the first N
    tile; ``x`` was just read by this program, so it comes from L1)."""
    blk = tl.arange(0, BLOCKS)
    col = (blk * _MX + k0)[:, None] + tl.arange(0, _MX)[None, :]
    for r in tl.static_range(BLOCK_M):
        row = first + r
        ok = col * 0 + row < M  # [BLOCKS, 32]: a tensor mask (the interpreter takes no scalar)
        x = tl.load(x_ptr + row * stride_xm + col, mask=ok, other=0.0).to(tl.float32)
        v, c = mx_quantize_tl(x, BLOCKS, _MX)
        tl.store(v_ptr + row * stride_vm + col, v, mask=ok)
        tl.store(c_ptr + row * stride_cm + k0 // _MX + blk, tl.reshape(c, (BLOCKS,)).to(tl.uint8),
                 mask=blk * 0 + row < M)  # fmt: skip


@triton.jit
def _rms_factors(a_ptr, first, M, stride_am, eps, K: tl.constexpr, K_PAD: tl.constexpr,
                 BLOCK_M: tl.constexpr):  # fmt: skip
    """The RMSNorm factor of each of the tile's token rows ``first ..`` over their ``K``
    columns, ``[BLOCK_M]`` (A_NORM; read once a program, not once a K step)."""
    kq = tl.arange(0, K_PAD)
    token = tl.arange(0, BLOCK_M)
    rms = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for r in tl.static_range(BLOCK_M):
        row = tl.minimum(first + r, M - 1)  # rows past M: stored nowhere
        q = tl.load(a_ptr + row * stride_am + kq, mask=kq < K, other=0.0).to(tl.float32)
        rms += tl.where(token == r, rms_factor_tl(q, K, eps), 0.0)
    return rms


@triton.jit
def o_fused_tile_tl(o_ptr, pos_ptr, cos_ptr, sin_ptr, rows, k0, group, row_ok, stride_om,
                    G: tl.constexpr, HEAD_DIM: tl.constexpr, NOPE: tl.constexpr,
                    HALF_ROPE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    """Fused columns ``k0 ..`` of group ``group``: column ``(c * G + h) * 32 + j`` is o's head
    ``group * G + h``, dim ``c * 32 + j``; inverse-RoPE'd (``v0 c + v1 s``, ``v1 c - v0 s``), bf16.

    Read as ``[BLOCK_M, chunks, 32]`` so each chunk is one contiguous 64-byte run of o;
    a chunk is all nope or all rope dims, and its pairs are split in registers.
    """
    CHUNKS: tl.constexpr = BLOCK_K // _O_CHUNK
    chunk = k0 // _O_CHUNK + tl.arange(0, CHUNKS)
    dim0 = (chunk // G) * _O_CHUNK  # first dim of each chunk within its head
    run = (group * G + chunk % G) * HEAD_DIM + dim0
    j = tl.arange(0, _O_CHUNK)
    at = rows[:, None, None] * stride_om + run[None, :, None] + j[None, None, :]
    v = tl.load(o_ptr + at, mask=row_ok[:, None, None], other=0.0).to(tl.float32)
    v0, v1 = tl.split(tl.reshape(v, (BLOCK_M, CHUNKS, _O_CHUNK // 2, 2)))
    is_rope = (dim0 >= NOPE)[None, :, None]
    pair = tl.where(dim0 >= NOPE, (dim0 - NOPE) // 2, 0)[:, None] + tl.arange(0, _O_CHUNK // 2)[None, :]
    pos = tl.load(pos_ptr + rows, mask=row_ok, other=0).to(tl.int64)
    trig = pos[:, None, None] * HALF_ROPE + pair[None, :, :]
    c = tl.load(cos_ptr + trig, mask=row_ok[:, None, None] & is_rope, other=1.0)
    s = tl.load(sin_ptr + trig, mask=row_ok[:, None, None] & is_rope, other=0.0)
    r0, r1 = rope_pair_tl(v0, v1, c, s, True)
    return bf16_round_tl(tl.reshape(tl.join(r0, r1), (BLOCK_M, BLOCK_K)))


@triton.jit
def _store_out_tl(acc, rows, row_ok, n0, out_ptr, out8_ptr, out8_codes_ptr, out_deq_ptr,
                  stride_om, stride_o8m, stride_o8cm, stride_odm, N: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, QUANT_OUT: tl.constexpr,
                  DEQ_OUT: tl.constexpr, HW: tl.constexpr):  # fmt: skip
    """The epilogue of output tile ``rows x n0 ..``: bf16 out of the fp32 ``acc`` and, with
    ``QUANT_OUT``, its MXFP8 cast (with ``DEQ_OUT`` also dequantized to bf16)."""
    n = n0 + tl.arange(0, BLOCK_N)
    out_ok = row_ok[:, None] & (n < N)[None, :]
    out = bf16_rn_tl(acc, HW)
    tl.store(out_ptr + rows[:, None] * stride_om + n[None, :], out.to(tl.bfloat16), mask=out_ok)
    if QUANT_OUT:
        v, c = mx_quantize_tl(out, BLOCK_M, BLOCK_N)
        tl.store(out8_ptr + rows[:, None] * stride_o8m + n[None, :], v, mask=out_ok)
        cn = n0 // _MX + tl.arange(0, BLOCK_N // _MX)
        tl.store(out8_codes_ptr + rows[:, None] * stride_o8cm + cn[None, :], c.to(tl.uint8),
                 mask=row_ok[:, None] & (cn < N // _MX)[None, :])  # fmt: skip
        if DEQ_OUT:
            deq = mx_dequantize_tl(v, c, BLOCK_M, BLOCK_N).to(tl.bfloat16)
            tl.store(out_deq_ptr + rows[:, None] * stride_odm + n[None, :], deq, mask=out_ok)


@triton.jit(do_not_specialize=["M"])
def mx_gemm_kernel(
    a_ptr,
    a_codes_ptr,
    w_ptr,
    w_codes_ptr,
    out_ptr,
    out8_ptr,
    out8_codes_ptr,
    out_deq_ptr,
    part_ptr,
    ticket_ptr,
    pos_ptr,
    cos_ptr,
    sin_ptr,
    norm_ptr,
    trace_ptr,
    eps,
    M,
    stride_am,
    stride_acm,
    stride_om,
    stride_o8m,
    stride_o8cm,
    stride_odm,
    N: tl.constexpr,
    K: tl.constexpr,
    N_PER_GROUP: tl.constexpr,
    A_MODE: tl.constexpr,
    QUANT_OUT: tl.constexpr,
    DOT_BF16: tl.constexpr,
    GEMV: tl.constexpr,
    G: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    NOPE: tl.constexpr,
    HALF_ROPE: tl.constexpr,
    K_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    USE_PDL: tl.constexpr = False,
    K_STEPS: tl.constexpr = 1,
    K_TAIL: tl.constexpr = 0,
    A8_OUT: tl.constexpr = False,
    DEQ_OUT: tl.constexpr = False,
    TRACE: tl.constexpr = False,
    HW_E4M3: tl.constexpr = False,
    rp_table_ptr=None,
    rp_win_ptr=None,
    rp_comp_ptr=None,
    rp_window_slots=0,
    rp_comp_slots=0,
    RP_PER: tl.constexpr = 0,
    RP_PAD: tl.constexpr = 1,
    RP_TOTAL: tl.constexpr = 0,
    RP_FMT: tl.constexpr = 0,
    RP_WIN_BLOCK: tl.constexpr = 1,
    RP_COMP_BLOCK: tl.constexpr = 1,
    CODE_WORDS: tl.constexpr = False,
    WEIGHTS_A: tl.constexpr = False,
    PRELOAD: tl.constexpr = False,
):
    """``out[m, n] = sum_k a8[m, g K + k] w8[n, k]`` over a K split, ``g = n // N_PER_GROUP``.
    ``HW_E4M3`` (the GPU): the CUDA-core loop's activation cast, and the bf16 rounds, use the
    hardware's conversions. ``DEQ_OUT`` (with ``QUANT_OUT``): the out8 values dequantized go
    to ``out_deq`` as bf16 too (the next GEMM's ``A_DEQ``). ``RP_PER`` > 0: before the PDL
    wait each program asks the L2 for its share of the records attention reads next
    (``RecordsAhead``, ``prefetch_share_tl``)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    K_SPLIT: tl.constexpr = K // SPLIT_K
    tl.static_assert(not DEQ_OUT or QUANT_OUT, "DEQ_OUT stores the out8 values dequantized")
    n0 = pid_n * BLOCK_N
    group = n0 // N_PER_GROUP
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    n = n0 + tl.arange(0, BLOCK_N)
    n_ok = n < N
    n64 = n.to(tl.int64)
    if TRACE:
        t_start = globaltimer_tl(pid_n)
    if GEMV:  # the first weight tile is loaded before the PDL wait: no step writes weights
        tl.static_assert(BLOCK_K * K_STEPS + K_TAIL == K_SPLIT,
                         "the CUDA-core loop takes K_STEPS whole K steps and a tail a program")
        BLOCKS: tl.constexpr = BLOCK_K // _MX
        w8, wc, col = _gemv_tile(w_ptr, w_codes_ptr, n64, n_ok, pid_k * K_SPLIT, K, BLOCKS)
        g = _gemv_norm_weight(norm_ptr, col, A_MODE)
        if K_TAIL > 0:  # a K that is no power of two: its last columns, also before the wait
            t8, tc, tcol = _gemv_tile(w_ptr, w_codes_ptr, n64, n_ok,
                                      (pid_k + 1) * K_SPLIT - K_TAIL, K, K_TAIL // _MX)  # fmt: skip
            tg = _gemv_norm_weight(norm_ptr, tcol, A_MODE)
    if PRELOAD:  # MMA, one K step a program: its weight tile is read before the wait
        tl.static_assert(not GEMV and BLOCK_K == K_SPLIT, "preload: one K step a program")
        w_values, w_codes = _mx_load(w_ptr, w_codes_ptr, n64, n_ok, K, K // _MX, pid_k * K_SPLIT,
                                     BLOCK_K, CODE_WORDS)  # fmt: skip
    if RP_PER > 0:  # the key table is a step input and no record is read: safe before the wait
        pid = (pid_m * SPLIT_K + pid_k) * tl.num_programs(0) + pid_n
        prefetch_share_tl(pid, rp_table_ptr, rp_win_ptr, rp_comp_ptr, rp_window_slots,
                          rp_comp_slots, RP_PER, RP_PAD, RP_TOTAL, RP_FMT, RP_WIN_BLOCK,
                          RP_COMP_BLOCK)  # fmt: skip
    pdl_prologue_tl(USE_PDL)
    if TRACE:
        t_waited = globaltimer_tl(pid_n)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if GEMV:
        # CUDA cores, no MMA: the weight tile [blocks, BLOCK_N, 32] is converted to fp32 once,
        # and for each token row every block's 32 products are summed (fp32 FMAs, IEEE), then
        # weighted by the weight's E8M0 scale; the row's MXFP8 value carries its own scale.
        # With K_STEPS > 1 the steps are unrolled (a program's split needs no partial sum
        # when SPLIT_K is 1). For one token row each product goes to its own lane and the
        # lanes are summed once at the end: no reduction (and no barrier) between steps, so
        # every step's loads can be in flight together.
        tl.static_assert(A_MODE != A_O, "the fused WO-A prologue runs on the MMA loop")
        # One token, one K step: every piece of the activation is read at once, right after
        # the wait (and A_NORM's RMS factor taken from those pieces), so the program pays one
        # L2 round trip for its activation, not one for the factor, one a piece.
        ONE: tl.constexpr = BLOCK_M == 1 and K_STEPS == 1 and (SPLIT_K == 1 or A_MODE != A_NORM)
        rms = tl.zeros((BLOCK_M,), dtype=tl.float32)
        if ONE:
            row = tl.minimum(pid_m, M - 1)
            k0 = pid_k * K_SPLIT
            x, xc = _gemv_act_load(a_ptr, a_codes_ptr, row, stride_am, stride_acm, group, k0, col,
                                   K, BLOCKS, A_MODE)  # fmt: skip
            if K_TAIL > 0:
                tk0 = k0 + BLOCK_K
                tx, txc = _gemv_act_load(a_ptr, a_codes_ptr, row, stride_am, stride_acm, group,
                                         tk0, tcol, K, K_TAIL // _MX, A_MODE)  # fmt: skip
            factor = 0.0
            if A_MODE == A_NORM:
                squares = tl.sum(tl.sum(x * x, axis=1), axis=0)
                if K_TAIL > 0:
                    squares += tl.sum(tl.sum(tx * tx, axis=1), axis=0)
                factor = rms_factor_of_tl(squares, K, eps)
            values, scales = _gemv_act_cast(x, xc, g, factor, BLOCKS, A_MODE, HW_E4M3)
            acc = _gemv_dot_one(acc, w8, wc, values, scales)
            if K_TAIL > 0:
                values, scales = _gemv_act_cast(tx, txc, tg, factor, K_TAIL // _MX, A_MODE,
                                                HW_E4M3)  # fmt: skip
                acc = _gemv_dot_one(acc, t8, tc, values, scales)
        elif A_MODE == A_NORM:
            rms = _rms_factors(a_ptr, pid_m * BLOCK_M, M, stride_am, eps, K, K_PAD, BLOCK_M)
        LANES: tl.constexpr = K_STEPS > 1 and BLOCK_M == 1
        if LANES:
            lanes = tl.zeros((BLOCKS, BLOCK_N, _MX), dtype=tl.float32)
        for step in tl.static_range(0 if ONE else K_STEPS):
            k0 = pid_k * K_SPLIT + step * BLOCK_K
            if step > 0:
                w8, wc, col = _gemv_tile(w_ptr, w_codes_ptr, n64, n_ok, k0, K, BLOCKS)
                g = _gemv_norm_weight(norm_ptr, col, A_MODE)
            if LANES:
                ws = e8m0_scale_tl(wc.to(tl.int32))
                a, sa = _gemv_act(a_ptr, a_codes_ptr, g, tl.minimum(pid_m, M - 1), stride_am,
                                  stride_acm, group, k0, col, tl.sum(rms), K, BLOCKS, A_MODE,
                                  HW_E4M3)  # fmt: skip
                lanes += w8.to(tl.float32) * a[:, None, :] * (ws * sa[:, None])[:, :, None]
            else:
                acc = _gemv_rows(acc, w8, wc, col, a_ptr, a_codes_ptr, g, pid_m * BLOCK_M,
                                 M, stride_am, stride_acm, group, k0, rms, K, BLOCKS, BLOCK_M,
                                 A_MODE, HW_E4M3)  # fmt: skip
        if LANES:
            acc += tl.sum(tl.sum(lanes, axis=2), axis=0)[None, :]
        if K_TAIL > 0 and not ONE:
            acc = _gemv_rows(acc, t8, tc, tcol, a_ptr, a_codes_ptr, tg, pid_m * BLOCK_M, M,
                             stride_am, stride_acm, group, (pid_k + 1) * K_SPLIT - K_TAIL, rms, K,
                             K_TAIL // _MX, BLOCK_M, A_MODE, HW_E4M3)  # fmt: skip
        if A8_OUT:  # a's MXFP8 form (x cast in the prologue), once: the first N tile stores it
            tl.static_assert(A_MODE == A_CAST and not QUANT_OUT, "A8_OUT stores a cast bf16 a")
            if pid_n == 0:
                for step in tl.static_range(K_STEPS):
                    _store_a8(a_ptr, out8_ptr, out8_codes_ptr, pid_m * BLOCK_M, M, stride_am,
                              stride_o8m, stride_o8cm, pid_k * K_SPLIT + step * BLOCK_K, BLOCKS,
                              BLOCK_M)  # fmt: skip
                if K_TAIL > 0:
                    _store_a8(a_ptr, out8_ptr, out8_codes_ptr, pid_m * BLOCK_M, M, stride_am,
                              stride_o8m, stride_o8cm, (pid_k + 1) * K_SPLIT - K_TAIL,
                              K_TAIL // _MX, BLOCK_M)  # fmt: skip
    else:
        tl.static_assert(A_MODE != A_NORM, "the fused RMSNorm prologue runs on the CUDA-core loop")
        if WEIGHTS_A:  # acc transposed in the loop
            acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        if PRELOAD:
            w = mx_dequantize_tl(w_values, w_codes, BLOCK_N, BLOCK_K)
            a = _mma_act(a_ptr, a_codes_ptr, pos_ptr, cos_ptr, sin_ptr, rows, row_ok, stride_am,
                         stride_acm, group, pid_k * K_SPLIT, K, A_MODE, DOT_BF16, G, HEAD_DIM,
                         NOPE, HALF_ROPE, BLOCK_M, BLOCK_K)  # fmt: skip
            acc = _mma_tl(acc, a, w, WEIGHTS_A, DOT_BF16)
        else:
            for k0 in range(pid_k * K_SPLIT, (pid_k + 1) * K_SPLIT, BLOCK_K):
                w = _mx_tile(w_ptr, w_codes_ptr, n64, n_ok, K, K // _MX, k0, BLOCK_N, BLOCK_K,
                             CODE_WORDS)  # fmt: skip
                a = _mma_act(a_ptr, a_codes_ptr, pos_ptr, cos_ptr, sin_ptr, rows, row_ok,
                             stride_am, stride_acm, group, k0, K, A_MODE, DOT_BF16, G, HEAD_DIM,
                             NOPE, HALF_ROPE, BLOCK_M, BLOCK_K)  # fmt: skip
                acc = _mma_tl(acc, a, w, WEIGHTS_A, DOT_BF16)
        if WEIGHTS_A:
            acc = tl.trans(acc)

    if TRACE:
        t_summed = globaltimer_tl(pid_n)
    out_ok = row_ok[:, None] & n_ok[None, :]
    last = True
    if SPLIT_K > 1:
        part_at = part_ptr + rows[:, None] * N + n[None, :]
        tl.store(part_at + pid_k * M * N, acc, mask=out_ok)
        tl.debug_barrier()
        tile = pid_m * tl.num_programs(0) + pid_n
        ticket = tl.atomic_add(ticket_ptr + tile, 1, sem="acq_rel", scope="gpu")
        last = ticket == SPLIT_K - 1
        if last:
            tl.debug_barrier()
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in range(SPLIT_K):
                acc += tl.load(part_at + s * M * N, mask=out_ok, other=0.0, cache_modifier=".cg")
            tl.atomic_xchg(ticket_ptr + tile, 0, sem="relaxed", scope="gpu")
    if last:
        _store_out_tl(acc, rows, row_ok, n0, out_ptr, out8_ptr, out8_codes_ptr, out_deq_ptr,
                      stride_om, stride_o8m, stride_o8cm, stride_odm, N, BLOCK_M, BLOCK_N,
                      QUANT_OUT, DEQ_OUT, HW_E4M3)  # fmt: skip
    if TRACE:  # (start, PDL wait over, end: ns; SM; K loop done: ns) of this program
        prog = (pid_m * tl.num_programs(1) + pid_k) * tl.num_programs(0) + pid_n
        at = trace_ptr + prog.to(tl.int64) * _TRACE_FIELDS
        tl.store(at, t_start)
        tl.store(at + 1, t_waited)
        tl.store(at + 2, globaltimer_tl(pid_n))
        tl.store(at + 3, smid_tl(pid_n).to(tl.int64))
        tl.store(at + 4, t_summed)


@dataclasses.dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    block_k: int
    split_k: int
    num_warps: int = 4
    num_stages: int = 4
    gemv: bool = False  # CUDA-core inner loop, one token row at a time (small M)
    k_steps: int = 1  # K steps a CUDA-core program runs, unrolled
    k_tail: int = 0  # CUDA-core, split_k 1: K's last columns, one more tile (a power of two)
    # MMA loop: the weight codes read as int32 words, so the K loop's pipeliner copies them
    # ahead with the values; else each K step waits for its codes' 1-B loads (an A/B choice)
    code_words: bool = False
    # MMA loop: the weights the A operand (acc [N, M], transposed at the end; an A/B choice)
    weights_a: bool = False
    # MMA loop of one K step a program (block_k * split_k = K): its weight tile read before the
    # PDL wait (the step's choice up to PRELOAD_MAX_M tokens where the platform has PDL)
    preload: bool = False

    @property
    def k_split(self) -> int:
        """K columns one program covers: ``K / split_k``."""
        return self.block_k * self.k_steps + self.k_tail


def block_m_for(m: int) -> int:
    """Rows of a tile: 16 (the smallest MMA) up to 64, the next power of two >= m."""
    return min(64, max(16, triton.next_power_of_2(m)))


@dataclasses.dataclass(frozen=True)
class GemvRules:
    """The CUDA-core loop's rules: which token buckets take it and how big its tiles are."""

    max_m: int = GEMV_MAX_M  # the largest token bucket it serves (0: none)
    tile: int = GEMV_TILE_BYTES  # the most weight bytes of a whole-row tile
    split_tile: int = GEMV_SPLIT_TILE_BYTES  # weight bytes of a split-K tile
    quant_tile: int = GEMV_QUANT_TILE_BYTES  # the same for a GEMM that casts its output
    tail: int = GEMV_TAIL_BYTES  # one token's whole-row tile bytes as a head and a tail (0: off)
    max_steps: int = GEMV_MAX_STEPS  # unrolled K steps of a whole-row tile

    def __post_init__(self):
        pow2 = lambda v: 4096 <= v <= 32768 and v & (v - 1) == 0  # noqa: E731
        checks = {
            "max_m": (0 <= self.max_m <= 48, "0 .. 48"),
            "tile": (pow2(self.tile), "a power of two 4096 .. 32768"),
            "split_tile": (pow2(self.split_tile), "a power of two 4096 .. 32768"),
            "quant_tile": (pow2(self.quant_tile), "a power of two 4096 .. 32768"),
            "tail": (self.tail == 0 or pow2(self.tail), "0 or a power of two 4096 .. 32768"),
            "max_steps": (1 <= self.max_steps <= 8, "1 .. 8"),
        }
        for name, (ok, expected) in checks.items():
            if not ok:
                got = getattr(self, name)
                raise ValueError(f"GemvRules.{name}: expected {expected}, got {got}")


GEMV = GemvRules()  # the rules every step uses


def _pow2_dividing(k: int, cap: int) -> int:
    """The largest power of two <= ``cap`` that divides ``k``."""
    block = cap
    while k % block:
        block //= 2
    return block


def _head_tail(k: int) -> tuple[int, int]:
    """``k`` as a power of two and a smaller power of two of whole MX blocks (or 0); ``(0,
    0)`` where it is no such sum."""
    head = 1 << (k.bit_length() - 1)
    tail = k - head
    if tail and (tail & (tail - 1) or tail % MX_BLOCK):
        return 0, 0
    return head, tail


def gemv_config(
    m: int, n_per_group: int, k: int, *, quant_out: bool, rules: GemvRules = GEMV
) -> GemmConfig:
    """Whole rows where they fit ``rules.tile`` bytes (at one token ``rules.tail`` bytes,
    unless that is 0) with no split-K sum in <= ``rules.max_steps`` unrolled K steps; at one
    token, where they fit ``rules.tail`` bytes, as a power-of-two tile and a tail; else
    ``rules.split_tile`` (``rules.quant_tile`` casting the output) bytes a tile, split over K."""
    block_k = _pow2_dividing(k, GEMV_BLOCK_K_MAX)
    one = rules.tail if m == 1 else 0  # one token: the bytes of a whole-row tile
    # (H200, tp 4, M = 1: wo_b in 16 rows of 2048, 27.7 / 27.7 us against 8 rows, 29.5 / 28.7)
    rows = min(GEMV_BLOCK_N[1], (one or rules.tile) // k)
    head, tail = _head_tail(k)
    k_tail = 0
    if not quant_out and rows >= 1 and k // block_k <= rules.max_steps:
        block_n = 1 << (rows.bit_length() - 1)  # the largest power of two <= rows
        k_steps, split_k = k // block_k, 1
    elif one and not quant_out and head and one >= k:
        block_n = 1 << (rows.bit_length() - 1)
        block_k, k_tail, k_steps, split_k = head, tail, 1, 1
    else:  # split K; QUANT_OUT casts whole MX blocks of output rows: >= 32 rows a tile
        least = MX_BLOCK if quant_out else GEMV_BLOCK_N[0]
        tile = rules.quant_tile if quant_out else rules.split_tile
        block_k = _pow2_dividing(k, min(GEMV_BLOCK_K_MAX // 2, tile // least))
        block_n = min(GEMV_BLOCK_N[1], tile // block_k)
        k_steps, split_k = 1, k // block_k
    while n_per_group % block_n:
        block_n //= 2
    warps = 8 if block_n * block_k > GEMV_WIDE_STEP else 4
    return GemmConfig(triton.next_power_of_2(m), block_n, block_k, split_k, num_warps=warps,
                      num_stages=1, gemv=True, k_steps=k_steps, k_tail=k_tail)  # fmt: skip


def gemm_config(
    m: int, n: int, k: int, *, n_per_group: int, quant_out: bool, sms: int,
    block_k_max: int = BLOCK_K_MAX, gemv_ok: bool = True, rules: GemvRules = GEMV,
    preload: int = 0,
) -> GemmConfig:  # fmt: skip
    """Tiles for a weight stream: enough (N tile, K split) programs for ``PROGRAMS_PER_SM`` a SM.

    Token buckets up to ``rules.max_m`` take the CUDA-core loop where ``gemv_ok``. A
    function of ``bucket_for(m)``, not m, so warming a bucket compiles every variant it serves;
    on ROCm K steps are at most ``ROCM_BLOCK_K_MAX``. ``preload`` > 0: the MMA loop of one K
    step a program of at most ``preload`` columns, read before the PDL wait (a step's choice:
    ``tuning.resolve``).
    """
    m = bucket_for(m)
    if gemv_ok and m <= rules.max_m:
        return gemv_config(m, n_per_group, k, quant_out=quant_out, rules=rules)
    block_m = block_m_for(m)
    # 64-row tiles split over K measured best on the H200 at every site (profile_step.py --sweep)
    block_n = 64 if n_per_group % 64 == 0 else 32
    if current_platform().kind == "rocm":
        block_k_max = min(block_k_max, ROCM_BLOCK_K_MAX)
        preload = min(preload, ROCM_BLOCK_K_MAX)
    block_k = _pow2_dividing(k, min(preload, block_k_max) if preload else block_k_max)
    if preload:
        return GemmConfig(block_m, block_n, block_k, k // block_k, num_warps=4, num_stages=1,
                          preload=True)  # fmt: skip
    tiles = triton.cdiv(n, block_n) * triton.cdiv(m, block_m)
    split_k = 1
    while tiles * split_k < PROGRAMS_PER_SM * sms:
        if (k // block_k) % (split_k * 2) == 0:
            split_k *= 2
        elif block_k > MIN_BLOCK_K:  # a narrower K step lets the split go on
            block_k //= 2
        else:
            break
    # A program runs few K steps: 2 stages and 4 warps beat 4 / 8 at M = 1 and 48 (H200 sweep).
    return GemmConfig(block_m, block_n, block_k, split_k, num_warps=4, num_stages=2)


class Scratch:
    """Split-K scratch of one device: fp32 partials and self-resetting tickets, grown on demand.

    Tickets start at 0 and the last program of a tile puts its ticket back to 0,
    so the buffers are reused by every launch (and by CUDA-graph replays) with
    no memset. Grow it before capturing a graph (a warm-up step does).
    """

    def __init__(self):
        self.part = torch.empty(0)
        self.tickets = torch.empty(0)
        self._retired: list[torch.Tensor] = []  # outgrown buffers a captured graph may still use
        # Set by a profiler (benchmarks/profile_step.py --gemv-trace): int64 [>= programs,
        # TRACE_FIELDS]; each program of this site's launches stamps its row (GPU only).
        self.trace: torch.Tensor | None = None

    def get(
        self, part_numel: int, tickets: int, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Partials (fp32, >= part_numel) and tickets (int32 zeros, >= tickets) on ``device``."""
        if self.part.device != device or self.part.numel() < part_numel:
            self._retired.append(self.part)
            self.part = torch.empty(max(part_numel, 1), dtype=torch.float32, device=device)
        if self.tickets.device != device or self.tickets.numel() < tickets:
            self._retired.append(self.tickets)
            self.tickets = torch.zeros(max(tickets, 1), dtype=torch.int32, device=device)
        return self.part, self.tickets


_SCRATCH: dict[str, Scratch] = {}


def scratch_for(name: str) -> Scratch:
    """The module-level scratch of one GEMM site (sites run one after another on a stream)."""
    return _SCRATCH.setdefault(name, Scratch())


def _check(name: str, t: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    if t.dtype != dtype or tuple(t.shape) != shape:
        raise ValueError(
            f"{name}: expected {str(dtype).removeprefix('torch.')} {list(shape)}, "
            f"got {str(t.dtype).removeprefix('torch.')} {list(t.shape)}"
        )
    if t.stride(-1) != 1:
        raise ValueError(f"{name}: expected a unit stride along the last dim, got {t.stride()}")


@dataclasses.dataclass(frozen=True)
class OInput:
    """A standard-layout bf16 attention output for the ``A_O`` prologue."""

    o: torch.Tensor  # bf16 [M, heads, head_dim], not yet inverse-RoPE'd
    positions: torch.Tensor  # [M] int
    cos: torch.Tensor  # fp32 [max_position, rope_dim / 2]
    sin: torch.Tensor
    nope: int  # 448
    heads_per_group: int  # 8


@dataclasses.dataclass(frozen=True)
class NormInput:
    """A bf16 activation normalised in the ``A_NORM`` prologue: ``bf16(rmsnorm(qr) * weight)``."""

    qr: torch.Tensor  # bf16 [M, K] (a view of the Wqkv output: its first q_rank columns)
    weight: torch.Tensor  # bf16 [K]
    eps: float


@dataclasses.dataclass(frozen=True)
class Dequantized:
    """An MXFP8 activation as its values dequantized to bf16 (exact), for the ``A_DEQ`` MMA loop."""

    a: torch.Tensor  # bf16 [M, G K]


def mx_gemm(
    a: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | OInput | NormInput | Dequantized,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    out8: tuple[torch.Tensor, torch.Tensor] | None = None,
    a8_out: tuple[torch.Tensor, torch.Tensor] | None = None,
    out_deq: torch.Tensor | None = None,
    n_per_group: int | None = None,
    scratch: Scratch | None = None,
    config: GemmConfig | None = None,
    records: RecordsAhead | None = None,
    pdl: bool | None = None,
) -> torch.Tensor:
    """``out = dequant(a8) @ dequant(w)^T`` per group of ``n_per_group`` rows -> bf16 ``[M, N]``.

    ``a``: bf16 ``[M, G K]`` (cast in the prologue), ``(values e4m3 [M, G K],
    codes uint8 [M, G K / 32])``, an ``OInput`` (fused WO-A), a ``NormInput``
    (the RMSNorm prologue, CUDA-core token buckets only) or a ``Dequantized`` (MMA
    token buckets only); ``G = N /
    n_per_group`` groups (1 unless grouped). ``w`` e4m3 ``[N, K]``, ``w_scale``
    uint8 ``[N, K / 32]``. ``out8 = (values e4m3 [M, N], codes uint8 [M, N /
    32])``, when given, receives the MXFP8 cast of the bf16 out. ``a8_out`` (the same
    formats, ``[M, K]``), when given with a bf16 ``a`` on the CUDA-core loop, receives the
    MXFP8 form of ``a`` the prologue made (wo_b casting z: wo_a then needs no MXFP8 epilogue).
    ``out_deq`` (bf16 ``[M, N]``, with ``out8``) receives out8's values dequantized (wo_a
    feeding a ``Dequantized`` z to wo_b).
    ``records``: the records attention reads next, which the programs of a CUDA-core loop ask
    the L2 for before their wait (where the platform has inline PTX: not on ROCm, nor under the
    interpreter, which has no L2). ``config`` and ``pdl`` (a step's ``Tuning`` passes both):
    None picks them for M.
    """
    n, k = w.shape
    _check("w", w, E4M3, (n, k))
    _check("w_scale", w_scale, torch.uint8, (n, k // MX_BLOCK))
    n_per_group = n if n_per_group is None else n_per_group
    if n % n_per_group:
        raise ValueError(f"n_per_group: expected a divisor of N = {n}, got {n_per_group}")
    groups = n // n_per_group
    dev = w.device
    cos = sin = pos = norm = None
    eps = 0.0
    geo = {"G": 1, "HEAD_DIM": 1, "NOPE": 0, "HALF_ROPE": 1}
    if isinstance(a, OInput):
        m = a.o.shape[0]
        hd = a.o.shape[-1]
        _check("o", a.o, torch.bfloat16, (m, groups * a.heads_per_group, hd))
        if a.heads_per_group * hd != k:
            raise ValueError(
                f"o: expected heads_per_group * head_dim = K = {k}, got {a.heads_per_group} * {hd}"
            )
        mode, a_val, a_codes, stride_am, stride_acm = A_O, a.o, a.o, a.o.stride(0), 0
        pos, cos, sin = a.positions, a.cos, a.sin
        geo = {"G": a.heads_per_group, "HEAD_DIM": hd, "NOPE": a.nope, "HALF_ROPE": a.cos.shape[1]}
    elif isinstance(a, NormInput):
        m = a.qr.shape[0]
        _check("qr", a.qr, torch.bfloat16, (m, k))
        _check("weight", a.weight, torch.bfloat16, (k,))
        if groups != 1:
            raise ValueError(f"qr: a normalised activation feeds one group, got {groups} groups")
        mode, a_val, a_codes, stride_am, stride_acm = A_NORM, a.qr, a.qr, a.qr.stride(0), 0
        norm, eps = a.weight, a.eps
    elif isinstance(a, tuple):
        a_val, a_codes = a
        m = a_val.shape[0]
        _check("a values", a_val, E4M3, (m, groups * k))
        _check("a codes", a_codes, torch.uint8, (m, groups * k // MX_BLOCK))
        mode, stride_am, stride_acm = A_MX, a_val.stride(0), a_codes.stride(0)
    elif isinstance(a, Dequantized):
        m = a.a.shape[0]
        _check("a dequantized", a.a, torch.bfloat16, (m, groups * k))
        mode, a_val, a_codes, stride_am, stride_acm = A_DEQ, a.a, a.a, a.a.stride(0), 0
    else:
        m = a.shape[0]
        _check("a", a, torch.bfloat16, (m, k))
        if groups != 1:
            raise ValueError(f"a: a bf16 activation is cast for one group, got {groups} groups")
        mode, a_val, a_codes, stride_am, stride_acm = A_CAST, a, a, a.stride(0), 0
    if out is None:
        out = torch.empty(m, n, dtype=torch.bfloat16, device=dev)
    _check("out", out, torch.bfloat16, (m, n))
    quant = out8 is not None
    if quant:
        _check("out8 values", out8[0], E4M3, (m, n))
        _check("out8 codes", out8[1], torch.uint8, (m, n // MX_BLOCK))
    if out_deq is not None:
        if not quant:
            raise ValueError("out_deq: expected it with out8 (it receives out8's values "
                             "dequantized), got no out8")  # fmt: skip
        _check("out_deq", out_deq, torch.bfloat16, (m, n))
    cfg = config or gemm_config(
        m, n, k, n_per_group=n_per_group, quant_out=quant, sms=sm_count(dev),
        block_k_max=O_PROLOGUE_BLOCK_K if mode == A_O else BLOCK_K_MAX,
        gemv_ok=mode not in (A_O, A_DEQ),
    )  # fmt: skip
    if a8_out is not None:
        if mode != A_CAST or quant or not cfg.gemv:
            got = "a bf16 a" if mode == A_CAST else "an a that is no bf16 tensor"
            raise ValueError(
                f"a8_out: expected a bf16 a on the CUDA-core loop and no out8, got {got}, "
                f"out8 {'given' if quant else 'none'} and {cfg}"
            )
        _check("a8_out values", a8_out[0], E4M3, (m, k))
        _check("a8_out codes", a8_out[1], torch.uint8, (m, k // MX_BLOCK))
    if mode == A_DEQ and cfg.gemv:
        raise ValueError(
            f"a: a Dequantized activation feeds the MMA loop (token buckets above "
            f"{GEMV.max_m} by default), got {m} tokens and {cfg}"
        )
    if mode == A_NORM and not cfg.gemv:
        raise ValueError(
            f"a: the RMSNorm prologue runs on the CUDA-core loop (token buckets up to "
            f"{GEMV.max_m} by default), got {m} tokens and {cfg}"
        )
    if (
        n_per_group % cfg.block_n
        or k % (cfg.k_split * cfg.split_k)
        or (quant and cfg.block_n % MX_BLOCK)
    ):
        raise ValueError(f"config: {cfg} does not tile N per group {n_per_group}, K {k}")
    if (cfg.k_steps != 1 or cfg.k_tail) and not cfg.gemv:
        raise ValueError(
            f"config: k_steps and k_tail are CUDA-core loop settings (gemv=True), got {cfg}"
        )
    if cfg.k_tail and (cfg.split_k != 1 or cfg.k_tail & (cfg.k_tail - 1) or cfg.k_tail % MX_BLOCK):
        raise ValueError(
            f"config: k_tail must be a power of two of whole MX blocks of {MX_BLOCK} with "
            f"split_k = 1, got {cfg}"
        )
    if cfg.block_k % MX_BLOCK or cfg.block_k & (cfg.block_k - 1):
        raise ValueError(
            f"config: block_k must be a power of two of whole MX blocks of {MX_BLOCK}, got {cfg}"
        )
    if cfg.code_words and (cfg.gemv or cfg.block_k % (4 * MX_BLOCK) or k % (4 * MX_BLOCK)
                           or w_scale.data_ptr() % 4):  # fmt: skip
        raise ValueError(
            f"config: code_words (the MMA loop reading the weight codes as 4-B words) needs "
            f"block_k and K multiples of {4 * MX_BLOCK} and 4-B aligned codes, got {cfg}, K {k} "
            f"and w_scale at {w_scale.data_ptr():#x}"
        )
    if cfg.weights_a and cfg.gemv:
        raise ValueError(
            f"config: weights_a (the weights the MMA's A operand) needs the MMA loop, got the "
            f"CUDA-core loop's {cfg}"
        )
    if cfg.preload and (cfg.gemv or cfg.block_k * cfg.split_k != k):
        raise ValueError(
            f"config: preload (the MMA loop's weights read before the wait) needs the MMA "
            f"loop and one K step a program (block_k * split_k = {k}), got {cfg}"
        )
    if cfg.gemv and (mode == A_O or cfg.k_split * cfg.split_k != k):
        raise ValueError(
            f"config: the CUDA-core loop takes MXFP8 or bf16 activations and whole K steps "
            f"((block_k * k_steps + k_tail) * split_k = {k}), got {cfg}"
        )
    grid = (triton.cdiv(n, cfg.block_n), cfg.split_k, triton.cdiv(m, cfg.block_m))
    trace = scratch.trace if scratch is not None else None
    if trace is not None and (trace.dtype != torch.int64 or trace.shape[0] < math.prod(grid)
                              or tuple(trace.shape[1:]) != (TRACE_FIELDS,)):  # fmt: skip
        raise ValueError(f"scratch.trace: expected int64 [>= {math.prod(grid)}, {TRACE_FIELDS}], "
                         f"got {trace.dtype} {list(trace.shape)}")  # fmt: skip
    if trace is not None and not current_platform().ptx:
        raise ValueError(f"scratch.trace: the trace reads NVIDIA's PTX timers, "
                         f"got {current_platform().features}")  # fmt: skip
    if cfg.split_k > 1:
        part, tickets = (scratch or scratch_for("default")).get(
            cfg.split_k * m * n, grid[0] * grid[2], dev
        )
    else:
        part = tickets = out
    o8v, o8c = out8 if quant else a8_out if a8_out is not None else (out, out)
    if pdl is None:
        pdl = pdl_enabled(m, cfg.gemv or cfg.preload)
    pdl = pdl and current_platform().pdl
    mx_gemm_kernel[grid](
        a_val,
        a_codes,
        w,
        w_scale,
        out,
        o8v,
        o8c,
        out_deq if out_deq is not None else out,
        part,
        tickets,
        pos if pos is not None else out,
        cos if cos is not None else out,
        sin if sin is not None else out,
        norm if norm is not None else out,
        trace if trace is not None else out,
        eps,
        m,
        stride_am,
        stride_acm,
        out.stride(0),
        o8v.stride(0),
        o8c.stride(0),
        out_deq.stride(0) if out_deq is not None else 0,
        N=n,
        K=k,
        N_PER_GROUP=n_per_group,
        A_MODE=mode,
        QUANT_OUT=quant,
        DOT_BF16=not interpreting(),
        HW_E4M3=not interpreting(),
        GEMV=cfg.gemv,
        K_PAD=triton.next_power_of_2(k),
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        SPLIT_K=cfg.split_k,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **geo,
        USE_PDL=pdl,
        K_STEPS=cfg.k_steps,
        K_TAIL=cfg.k_tail,
        A8_OUT=a8_out is not None,
        DEQ_OUT=out_deq is not None,
        TRACE=trace is not None,
        CODE_WORDS=cfg.code_words,
        WEIGHTS_A=cfg.weights_a,
        PRELOAD=cfg.preload,
        **(records.kernel_args(math.prod(grid)) if records is not None and cfg.gemv
           and current_platform().ptx else {}),
        **pdl_launch_options(pdl),
    )
    return out
