"""The grouped o_proj cast: standard bf16 o -> inverse RoPE -> bf16 -> fused MXFP8 (docs/design.md
§2.6-2.7).

``xo[m, g * GK + (c * G + h) * 32 + j] = mxfp8(bf16(inverse_rope(o[m, g * G + h, c * 32 + j])))``
with its code at column ``g * GK / 32 + c * G + h``: the same values and codes
the mega attention kernel writes, and the activation of the ``wo_a`` GEMM
(``mx_gemm`` with ``A_MX``). One program casts ``BLOCK_M`` tokens by
``BLOCK_K`` fused columns of one group.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41.common.mx import E4M3, MX_BLOCK, mx_quantize_tl
from dsv41.nvidia.ops.mx_gemm import o_fused_tile_tl

BLOCK_K = 512  # fused columns a program casts
BLOCK_M = 16  # tokens a program casts


@triton.jit(do_not_specialize=["M"])
def o_cast_kernel(
    o_ptr,
    pos_ptr,
    cos_ptr,
    sin_ptr,
    xo_ptr,
    xo_codes_ptr,
    M,
    stride_om,
    stride_xm,
    stride_xcm,
    GK: tl.constexpr,
    G: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    NOPE: tl.constexpr,
    HALF_ROPE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Tokens ``pid_m`` x fused columns ``pid_k`` of group ``pid_g``: values and codes of xo."""
    pid_k = tl.program_id(0)
    group = tl.program_id(1)
    rows = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    cols = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    o = o_fused_tile_tl(o_ptr, pos_ptr, cos_ptr, sin_ptr, rows, pid_k * BLOCK_K, group, row_ok,
                        stride_om, G, HEAD_DIM, NOPE, HALF_ROPE, BLOCK_M, BLOCK_K)  # fmt: skip
    v, c = mx_quantize_tl(o, BLOCK_M, BLOCK_K)
    tl.store(
        xo_ptr + rows[:, None] * stride_xm + (group * GK + cols)[None, :], v, mask=row_ok[:, None]
    )
    cc = (group * GK + pid_k * BLOCK_K) // 32 + tl.arange(0, BLOCK_K // 32)
    tl.store(
        xo_codes_ptr + rows[:, None] * stride_xcm + cc[None, :],
        c.to(tl.uint8),
        mask=row_ok[:, None],
    )


def o_cast(
    o: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    nope: int,
    heads_per_group: int,
    xo: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``o`` bf16 [M, heads, 512], before inverse RoPE -> fused ``(xo e4m3, codes uint8)``.

    ``xo`` is ``[M, heads * 512]``, ``codes`` ``[M, heads * 16]``.
    """
    m, heads, hd = o.shape
    if (
        o.dtype != torch.bfloat16
        or o.stride(-1) != 1
        or o.stride(1) != hd
        or heads % heads_per_group
    ):
        raise ValueError(
            f"o: expected bf16 [M, heads, head_dim] with heads a multiple of "
            f"{heads_per_group}, contiguous heads, got {o.dtype} {list(o.shape)}"
        )
    gk = heads_per_group * hd
    if gk % BLOCK_K:
        raise ValueError(
            f"o: expected heads_per_group * head_dim a multiple of {BLOCK_K}, got {gk}"
        )
    if xo is None:
        xo = (
            torch.empty(m, heads * hd, dtype=E4M3, device=o.device),
            torch.empty(m, heads * hd // MX_BLOCK, dtype=torch.uint8, device=o.device),
        )
    grid = (gk // BLOCK_K, heads // heads_per_group, triton.cdiv(m, BLOCK_M))
    o_cast_kernel[grid](
        o,
        positions,
        cos,
        sin,
        xo[0],
        xo[1],
        m,
        o.stride(0),
        xo[0].stride(0),
        xo[1].stride(0),
        GK=gk,
        G=heads_per_group,
        HEAD_DIM=hd,
        NOPE=nope,
        HALF_ROPE=cos.shape[1],
        BLOCK_M=BLOCK_M,
        BLOCK_K=BLOCK_K,
        num_warps=8,
    )
    return xo
