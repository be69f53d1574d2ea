"""Output projection of a standard-layout o: ``y = wo_b(mxfp8(wo_a(mxfp8(inverse_rope(o)))))``.

docs/design.md §2.6-2.8 and §6.

``o_proj`` serves attention kernels other than the mega kernel, whose bf16
``o [M, heads, 512]`` is in the standard layout and not yet inverse-RoPE'd.
For a few tokens one launch (the fused WO-A kernel: ``mx_gemm`` with the
``A_O`` prologue) reads o through ``wo_a``'s fused columns, turns the rope
dims back, rounds to bf16, casts to MXFP8, runs the grouped GEMM and writes z
in bf16 and MXFP8; otherwise the grouped path casts o once (``o_cast``) and
runs the plain grouped ``wo_a`` GEMM. Then ``wo_b``. Both paths feed the dot
the same exact values (one cast helper, ``o_fused_tile_tl``); only the fp32
summation order may differ.
"""

from __future__ import annotations

import torch

from dsv41.common.mx import E4M3, MX_BLOCK
from dsv41.common.rope import rope_tables
from dsv41.common.weights import LayerWeights
from dsv41.nvidia.ops.mx_gemm import O_PROLOGUE_BLOCK_K, OInput, Scratch, mx_gemm, scratch_for
from dsv41.nvidia.ops.o_cast import BLOCK_K as O_CAST_BLOCK_K
from dsv41.nvidia.ops.o_cast import o_cast

FUSED_WO_A_MAX_TOKENS = 32
MIN_BLOCK_N = 32  # z's MXFP8 epilogue needs whole 32-column blocks in a tile


def can_fuse_wo_a(layer: LayerWeights, m: int) -> bool:
    """Whether the fused WO-A kernel serves ``m`` tokens of this layer."""
    model = layer.dims.model
    return (
        # Each (N tile, K split) program re-casts its tokens' o slice from bf16: past 32 tokens
        # the recast outweighs one separate cast pass, and a 64-row gathered o tile spills.
        1 <= m <= FUSED_WO_A_MAX_TOKENS
        # The prologue reads a group's fused columns in whole 128-column steps.
        and layer.dims.group_k % O_PROLOGUE_BLOCK_K == 0
        # z's MXFP8 cast runs in the epilogue: an N tile holds whole 32-column blocks of a group.
        and model.o_rank % MIN_BLOCK_N == 0
    )


def wo_a_from_o(
    layer: LayerWeights,
    o: torch.Tensor,
    positions: torch.Tensor,
    *,
    fused: bool | None = None,
    scratch: Scratch | None = None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """``o`` bf16 [M, heads, 512] -> ``(z bf16 [M, o_rows], z8 (e4m3, uint8 codes))``.

    ``fused`` None picks the fused WO-A kernel where ``can_fuse_wo_a`` allows it.
    """
    model, dims = layer.dims.model, layer.dims
    m = o.shape[0]
    if tuple(o.shape) != (m, dims.heads, model.head_dim) or o.dtype != torch.bfloat16:
        raise ValueError(
            f"o: expected bfloat16 [M, {dims.heads}, {model.head_dim}], "
            f"got {o.dtype} {list(o.shape)}"
        )
    if positions.shape != (m,):
        raise ValueError(f"positions: expected [{m}], got {list(positions.shape)}")
    fused = can_fuse_wo_a(layer, m) if fused is None else fused
    if fused and not can_fuse_wo_a(layer, m):
        raise ValueError(
            f"fused: the fused WO-A kernel does not serve {m} tokens (can_fuse_wo_a is False)"
        )
    o = o.contiguous()
    cos, sin = rope_tables(model, layer.layer_id, o.device)
    z = torch.empty(m, dims.o_rows, dtype=torch.bfloat16, device=o.device)
    z8 = (
        torch.empty(m, dims.o_rows, dtype=E4M3, device=o.device),
        torch.empty(m, dims.o_rows // MX_BLOCK, dtype=torch.uint8, device=o.device),
    )
    scratch = scratch or scratch_for("wo_a")
    if fused:
        a = OInput(o, positions, cos, sin, model.nope_dim, model.heads_per_group)
    else:
        if dims.group_k % O_CAST_BLOCK_K:
            raise ValueError(
                f"o: grouped path needs group_k a multiple of {O_CAST_BLOCK_K}, got {dims.group_k}"
            )
        a = o_cast(
            o, positions, cos, sin, nope=model.nope_dim, heads_per_group=model.heads_per_group
        )
    mx_gemm(
        a, layer.wo_a, layer.wo_a_scale, out=z, out8=z8, n_per_group=model.o_rank, scratch=scratch
    )
    return z, z8


def o_proj(layer: LayerWeights, o: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """This rank's bf16 partial ``y [M, hidden]`` from a standard-layout bf16 ``o [M, heads, 512]``.

    ``o`` is the attention output before inverse RoPE (what any attention
    kernel produces); ``positions`` [M] int are the tokens' positions.
    """
    _, z8 = wo_a_from_o(layer, o, positions)
    return mx_gemm(z8, layer.wo_b, layer.wo_b_scale, scratch=scratch_for("wo_b"))
