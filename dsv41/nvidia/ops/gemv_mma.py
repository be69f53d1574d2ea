"""One token's MXFP8 GEMV on e4m3 tensor cores: ``out[0, n] = dequant(a8[0]) . dequant(w[n])``.

Past its PDL wait a one-token GEMM program on CUDA cores is bound by instruction issue: about
2.5 instructions a weight byte for the dot alone (e4m3 pairs to f16, f16 to f32, an FMA) and 4
to 7 with the rest (BENCHMARKS.md, session 19). Here one warp instruction,
``mma.sync.m16n8k32.row.col.f32.e4m3.e4m3.f32``, takes 16 weight rows x one MX block (32
columns, 512 bytes): the weight bytes are the A fragments as loaded (no conversion, no more
registers than the bytes), the activation's block is column 0 of B (the other 7 columns 0),
and D's column 0 is the block's 16 fp32 sums, which the weight's and the activation's E8M0
scales then weight in fp32 (as the CUDA-core loop weights its block sums).

A program takes 16 rows and all of K: warp w the MX blocks ``w * BPW ..`` (``BPW`` = K / 32 /
warps), its A fragments loaded, with the weight's codes, before the PDL wait. Triton has no
such dot at one token, so the instruction goes through ``tl.inline_asm_elementwise`` on
``[BPW, 32 * warps]`` tensors that hold one element a thread for each block (``e`` is thread
e: lane ``e % 32`` of warp ``e // 32``; the SM90 compile test checks that layout). Lane (g =
lane // 4, t = lane % 4) holds bytes ``8 s .. 8 s + 7`` (``s`` = (0, 2, 1, 3)[t], so adjacent
lanes read no adjacent words and no load is vectorized across threads) of the block in rows g
and g + 8: A's slots ``4t ..`` and ``16 + 4t ..`` of rows g, g + 8 (a0 .. a3), and in lanes g = 0
the same bytes of the activation (b0, b1), so A and B agree on one permutation of the block's
32 columns and the sum is the block's. D's column 0 sits in lanes t = 0 (rows g and g + 8).
The warps' sums are added in fp32 and rounded once to bf16 (nearest even).

Under the interpreter (CPU tests) the instruction is computed from the same fragments by
tensor arithmetic (``_mma_col0_tl``'s emulation: each row's 32 exact products summed in fp32),
so the fragments' addresses, the permutation and the scales are what the CPU tests check; the
GPU tests check the instruction.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from dsv41.common.mx import E4M3, MX_BLOCK, bf16_rn_tl, e8m0_scale_tl
from dsv41.common.switches import env_flag
from dsv41.common.timer_tl import globaltimer_tl, smid_tl
from dsv41.nvidia.ops.pdl import pdl_enabled, pdl_launch_options, pdl_prologue_tl

ROWS = 16  # weight rows a program: A's M
WARPS = 8
TRACE_FIELDS = 4  # as mx_gemm's: start, PDL wait over, end (ns), SM
_TRACE_FIELDS = tl.constexpr(TRACE_FIELDS)
_MX = tl.constexpr(MX_BLOCK)
_MMA = tl.constexpr(
    "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {$0, $1, $2, $3}, {$4, $5, $6, $7}, "
    "{$8, $9}, {$10, $11, $12, $13};"
)


def gemv_mma_enabled() -> bool:
    """Whether one-token GEMMs on an MXFP8 activation run on e4m3 tensor cores (``gemv_mma``):
    ``DSV41_GEMV_MMA`` (1 or 0), off by default."""
    return bool(env_flag("DSV41_GEMV_MMA", False))


def gemv_mma_fits(m: int, n_per_group: int, k: int) -> bool:
    """Whether ``gemv_mma`` takes a GEMM of ``m`` tokens, ``n_per_group`` rows a group and
    ``k`` columns: one token, whole 16-row tiles in a group, a power of two of MX blocks for
    every warp."""
    bpw = k // (MX_BLOCK * WARPS)
    return (m == 1 and n_per_group % ROWS == 0 and k % (MX_BLOCK * WARPS) == 0
            and bpw & (bpw - 1) == 0)  # fmt: skip


@triton.jit
def _e4m3_bytes_dot_tl(x, y):
    """The four e4m3 bytes of each int32 of ``x`` times those of ``y``, summed: fp32."""
    s = tl.zeros(x.shape, tl.float32)
    for i in tl.static_range(4):
        xv = ((x >> (8 * i)) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True)
        yv = ((y >> (8 * i)) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True)
        s += xv.to(tl.float32) * yv.to(tl.float32)
    return s


@triton.jit
def _mma_col0_tl(a0, a1, a2, a3, b0, b1, BPW: tl.constexpr, NW: tl.constexpr,
                 PTX: tl.constexpr):  # fmt: skip
    """D's column 0 of each block's MMA, ``(rows g, rows g + 8)`` ``[BPW, 32 NW]`` fp32 (lanes t
    = 0; 0 elsewhere): with ``PTX`` the tensor-core instruction, else the same sums from the
    fragments by tensor arithmetic (the interpreter)."""
    if PTX:
        z = tl.zeros(a0.shape, tl.float32)
        d0, _d1, d2, _d3 = tl.inline_asm_elementwise(  # D columns 0 (d0, d2) and 1 (the _s)
            _MMA, "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", [a0, a1, a2, a3, b0, b1, z, z, z, z],
            dtype=(tl.float32, tl.float32, tl.float32, tl.float32), is_pure=True, pack=1,
        )  # fmt: skip
        return d0, d2
    shape4: tl.constexpr = (BPW, NW, 8, 4)  # block, warp, g, t
    # B's column 0: lanes g = 0 hold it, the others 0; each t's words, for every g
    c0 = tl.sum(tl.reshape(b0, shape4), axis=2)[:, :, None, :]
    c1 = tl.sum(tl.reshape(b1, shape4), axis=2)[:, :, None, :]
    top = _e4m3_bytes_dot_tl(tl.reshape(a0, shape4), c0) + _e4m3_bytes_dot_tl(
        tl.reshape(a2, shape4), c1
    )
    low = _e4m3_bytes_dot_tl(tl.reshape(a1, shape4), c0) + _e4m3_bytes_dot_tl(
        tl.reshape(a3, shape4), c1
    )
    t = tl.arange(0, 4)[None, None, None, :]
    d0 = tl.where(t == 0, tl.sum(top, axis=3)[:, :, :, None], 0.0)
    d2 = tl.where(t == 0, tl.sum(low, axis=3)[:, :, :, None], 0.0)
    return tl.reshape(d0, (BPW, NW * 32)), tl.reshape(d2, (BPW, NW * 32))


@triton.jit
def gemv_mma_kernel(
    a_ptr, a_codes_ptr, w_ptr, w_codes_ptr, out_ptr, trace_ptr,
    K: tl.constexpr, N_PER_GROUP: tl.constexpr, NW: tl.constexpr, BPW: tl.constexpr,
    USE_PDL: tl.constexpr, PTX: tl.constexpr, TRACE: tl.constexpr = False,
):  # fmt: skip
    """Rows ``pid * 16 ..`` of ``out [1, N]`` (bf16) from e4m3 ``a [1, G K]`` with codes
    ``[1, G K / 32]`` (group ``n // N_PER_GROUP``'s K columns) and e4m3 ``w [N, K]`` with codes
    ``[N, K / 32]`` (module docstring). ``TRACE``: this program's stamps in ``trace_ptr``'s
    row (start, PDL wait over, end, SM)."""
    pid = tl.program_id(0)
    if TRACE:
        t_start = globaltimer_tl(pid)
    n0 = pid * 16
    group = n0 // N_PER_GROUP
    e = tl.arange(0, 32 * NW)
    lane = e % 32
    g = lane // 4
    t = lane % 4
    s = ((t & 1) << 1) | (t >> 1)  # the lane's 8 bytes of a block: 8 s .. 8 s + 7
    blk = (e // 32 * BPW)[None, :] + tl.arange(0, BPW)[:, None]  # [BPW, 32 NW]: this warp's
    word = blk * (_MX // 4) + (2 * s)[None, :]  # the lane's first int32 of the block
    row = (n0 + g).to(tl.int64)[None, :]
    w_words = w_ptr.to(tl.pointer_type(tl.int32))
    at = row * (K // 4) + word  # row g; row g + 8 sits 8 K bytes further
    a0 = tl.load(w_words + at)
    a2 = tl.load(w_words + at + 1)
    a1 = tl.load(w_words + at + 2 * K)
    a3 = tl.load(w_words + at + 2 * K + 1)
    ws0 = tl.load(w_codes_ptr + row * (K // _MX) + blk)
    ws1 = tl.load(w_codes_ptr + (row + 8) * (K // _MX) + blk)
    pdl_prologue_tl(USE_PDL)
    if TRACE:
        t_waited = globaltimer_tl(pid)
    col0 = (tl.where(g == 0, lane, -1) >= 0)[None, :]  # B's column 0: lanes g = 0
    x_words = a_ptr.to(tl.pointer_type(tl.int32)) + group * (K // 4)
    b0 = tl.load(x_words + word, mask=col0, other=0)
    b1 = tl.load(x_words + word + 1, mask=col0, other=0)
    sa = e8m0_scale_tl(tl.load(a_codes_ptr + group * (K // _MX) + blk).to(tl.int32))
    d0, d2 = _mma_col0_tl(a0, a1, a2, a3, b0, b1, BPW, NW, PTX)
    top = tl.sum(d0 * (e8m0_scale_tl(ws0.to(tl.int32)) * sa), axis=0)  # [32 NW]: a warp's share
    low = tl.sum(d2 * (e8m0_scale_tl(ws1.to(tl.int32)) * sa), axis=0)
    top = tl.sum(tl.reshape(top, (NW, 32)), axis=0)  # [32] by lane: the warps' shares added
    low = tl.sum(tl.reshape(low, (NW, 32)), axis=0)
    lanes = tl.arange(0, 32)
    keep = tl.where(lanes % 4 == 0, lanes, -1) >= 0  # D's column 0
    rows = n0 + lanes // 4
    tl.store(out_ptr + rows, bf16_rn_tl(top, PTX).to(tl.bfloat16), mask=keep)
    tl.store(out_ptr + rows + 8, bf16_rn_tl(low, PTX).to(tl.bfloat16), mask=keep)
    if TRACE:
        at_trace = trace_ptr + pid.to(tl.int64) * _TRACE_FIELDS
        tl.store(at_trace, t_start)
        tl.store(at_trace + 1, t_waited)
        tl.store(at_trace + 2, globaltimer_tl(pid))
        tl.store(at_trace + 3, smid_tl(pid).to(tl.int64))


def gemv_mma(
    a8: tuple[torch.Tensor, torch.Tensor],
    w: torch.Tensor,
    w_scale: torch.Tensor,
    out: torch.Tensor,
    n_per_group: int,
    trace: torch.Tensor | None = None,
) -> torch.Tensor:
    """``out [1, N] = dequant(a8) @ dequant(w)^T`` per group of ``n_per_group`` rows (bf16) on
    e4m3 tensor cores; ``a8 = (values e4m3 [1, G K], codes uint8 [1, G K / 32])``, ``w`` e4m3
    ``[N, K]``, ``w_scale`` uint8 ``[N, K / 32]``, all contiguous (``mx_gemm`` checks the
    shapes and calls this where ``gemv_mma_fits``)."""
    values, codes = a8
    n, k = w.shape
    if not gemv_mma_fits(values.shape[0], n_per_group, k):
        raise ValueError(
            f"a8: expected one token, 16-row tiles and K a power of two of {MX_BLOCK * WARPS}, got "
            f"M = {values.shape[0]}, {n_per_group} rows a group, K = {k}"
        )
    for name, x in (("a values", values), ("a codes", codes), ("w", w), ("w_scale", w_scale),
                    ("out", out)):  # fmt: skip
        if not x.is_contiguous():
            raise ValueError(f"{name}: expected a contiguous tensor, got strides {x.stride()}")
    if values.dtype != E4M3 or w.dtype != E4M3:
        raise ValueError(f"a values / w: expected e4m3, got {values.dtype} / {w.dtype}")
    ptx = os.environ.get("TRITON_INTERPRET") != "1"
    pdl = pdl_enabled(1)
    gemv_mma_kernel[(n // ROWS,)](
        values, codes, w, w_scale, out, trace if trace is not None else out,
        K=k, N_PER_GROUP=n_per_group, NW=WARPS, BPW=k // (MX_BLOCK * WARPS), USE_PDL=pdl,
        PTX=ptx, TRACE=trace is not None, num_warps=WARPS, **pdl_launch_options(pdl),
    )  # fmt: skip
    return out
