"""x's MXFP8 values dequantized to bf16, once a step: the ``A_DEQ`` activation of Wqkv's MMA loop.

``out = bf16(dequant(mxfp8(x)))``, exact (an e4m3 value times a power of two), so Wqkv's
programs read their dot operand instead of each casting x again (docs/design.md §2.1). One
program rounds ``BLOCK_M`` tokens by ``BLOCK_K`` columns.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41.common.mx import MX_BLOCK, mx_round_tl
from dsv41.common.platform import current_platform
from dsv41.nvidia.ops.mx_gemm import _check
from dsv41.nvidia.ops.pdl import pdl_enabled, pdl_launch_options, pdl_prologue_tl

BLOCK_M = 16  # tokens a program rounds
BLOCK_K = 512  # columns a program rounds, at most (the largest power of two dividing K)


@triton.jit(do_not_specialize=["M"])
def mx_round_kernel(x_ptr, out_ptr, M, stride_xm, stride_om, BLOCK_M: tl.constexpr,
                    BLOCK_K: tl.constexpr, USE_PDL: tl.constexpr = False):  # fmt: skip
    """Tokens ``pid_m`` x columns ``pid_k``: ``out = bf16(dequant(mxfp8(x)))``."""
    pdl_prologue_tl(USE_PDL)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    ok = (rows < M)[:, None]
    x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask=ok, other=0.0)
    a = mx_round_tl(x.to(tl.float32), BLOCK_M, BLOCK_K)
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], a.to(tl.bfloat16), mask=ok)


def mx_round(x: torch.Tensor, out: torch.Tensor, *, pdl: bool | None = None) -> torch.Tensor:
    """``out`` bf16 ``[M, K]`` = x's MXFP8 values dequantized (x bf16 ``[M, K]``, K a multiple
    of 32); ``pdl``: a step's ``Tuning`` passes it, None picks it for M."""
    m, k = x.shape
    _check("x", x, torch.bfloat16, (m, k))
    _check("out", out, torch.bfloat16, (m, k))
    if k % MX_BLOCK:
        raise ValueError(f"x: expected columns a multiple of {MX_BLOCK} (whole MX blocks), "
                         f"got {k}")  # fmt: skip
    block_k = min(BLOCK_K, k & -k)
    pdl = pdl_enabled(m) if pdl is None else pdl and current_platform().pdl
    grid = (k // block_k, triton.cdiv(m, BLOCK_M))
    mx_round_kernel[grid](x, out, m, x.stride(0), out.stride(0), BLOCK_M=BLOCK_M, BLOCK_K=block_k,
                          num_warps=4, USE_PDL=pdl, **pdl_launch_options(pdl))  # fmt: skip
    return out
