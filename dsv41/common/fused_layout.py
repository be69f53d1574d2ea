"""Fused Q and O layouts: load-time permutations so no kernel shuffles per step (docs/design.md §5).

The wq_b GEMM emits q in the *fused Q layout*: 16-dim chunks interleaved across
a rank's heads, so an attention program reading one 16-dim slice of every head
reads one contiguous run. The attention kernel writes xo in the *fused O layout*:
per group of 8 heads, 32-dim chunks (one MX block each) interleaved across the
heads, which is the order the wo_a GEMM reads its K dimension in. Both are
realised by permuting weights once at load: wq_b rows (and their per-row
scales) by the Q permutation, wo_a columns by the O permutation and wo_a's scale
columns by its chunk form. The one invariant everywhere: ``fused = standard[perm]``.

The permutation runs inside each parameter's ``weight_loader`` right after the
shard is written (``permute_on_load``), never as a separate post-load pass, so
loading twice, loading after quantization hooks, and dummy loads all leave the
kernel-visible tensor permuted exactly once.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Q_CHUNK = 16  # dims of a head per interleaved Q chunk
O_CHUNK = 32  # dims of a head per interleaved O chunk (one MX block)

WeightLoader = Callable[[torch.nn.Parameter, torch.Tensor], None]


def q_fused_permutation(num_heads: int, head_dim: int) -> torch.Tensor:
    """``perm[(d // 16) * (H * 16) + h * 16 + d % 16] = h * D + d``, int64 [H * D]."""
    if head_dim % Q_CHUNK:
        raise ValueError(f"head_dim: expected a multiple of {Q_CHUNK}, got {head_dim}")
    h = torch.arange(num_heads).view(1, num_heads, 1)
    c = torch.arange(head_dim // Q_CHUNK).view(-1, 1, 1)
    j = torch.arange(Q_CHUNK).view(1, 1, Q_CHUNK)
    return (h * head_dim + c * Q_CHUNK + j).reshape(-1)


def o_fused_permutation(heads_per_group: int, head_dim: int) -> torch.Tensor:
    """``perm[(c * G + h) * 32 + j] = h * D + c * 32 + j``, int64 [G * D], one group."""
    if head_dim % O_CHUNK:
        raise ValueError(f"head_dim: expected a multiple of {O_CHUNK}, got {head_dim}")
    h = torch.arange(heads_per_group).view(1, -1, 1)
    c = torch.arange(head_dim // O_CHUNK).view(-1, 1, 1)
    j = torch.arange(O_CHUNK).view(1, 1, O_CHUNK)
    return (h * head_dim + c * O_CHUNK + j).reshape(-1)


def o_fused_chunk_permutation(heads_per_group: int, head_dim: int) -> torch.Tensor:
    """The O permutation on 32-wide chunks (scale columns): ``o_perm[::32] // 32``."""
    return o_fused_permutation(heads_per_group, head_dim)[::O_CHUNK] // O_CHUNK


def inverse_permutation(perm: torch.Tensor) -> torch.Tensor:
    """``inv[perm[i]] = i``."""
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel(), device=perm.device)
    return inv


def as_uint8(t: torch.Tensor) -> torch.Tensor:
    """A 1-byte tensor (e4m3, E8M0, int8) viewed as uint8, so indexing never touches fp8 kernels."""
    if t.element_size() != 1:
        raise ValueError(f"t: expected a 1-byte dtype, got {t.dtype}")
    return t.view(torch.uint8)


def permute(t: torch.Tensor, perm: torch.Tensor, dim: int) -> torch.Tensor:
    """``t.index_select(dim, perm)``; 1-byte dtypes go through a uint8 view."""
    perm = perm.to(t.device)
    if t.element_size() == 1 and t.dtype != torch.uint8:
        return as_uint8(t).index_select(dim, perm).view(t.dtype)
    return t.index_select(dim, perm)


def permute_q_to_fused(q: torch.Tensor) -> torch.Tensor:
    """``q [..., H, D]`` standard -> fused, the input's shape: ``fused.flatten(-2) =
    standard.flatten(-2)[..., q_perm]`` (a new tensor, as vLLM's function of this name)."""
    h, d = q.shape[-2:]
    return permute(q.reshape(*q.shape[:-2], h * d), q_fused_permutation(h, d), -1).view(q.shape)


def permute_q_from_fused(q: torch.Tensor, num_heads: int, head_dim: int) -> torch.Tensor:
    """``q [..., H * D]`` fused -> ``[..., H, D]`` standard."""
    inv = inverse_permutation(q_fused_permutation(num_heads, head_dim))
    return permute(q, inv, -1).reshape(*q.shape[:-1], num_heads, head_dim)


def permute_o_to_fused(o: torch.Tensor, heads_per_group: int) -> torch.Tensor:
    """``o [..., H, D]`` standard -> fused, the input's shape: the O permutation applied per
    group of ``heads_per_group`` heads (a new tensor, as vLLM's function of this name)."""
    h, d = o.shape[-2:]
    if h % heads_per_group:
        raise ValueError(f"o: expected heads a multiple of {heads_per_group}, got {h}")
    groups = o.reshape(*o.shape[:-2], h // heads_per_group, heads_per_group * d)
    fused = permute(groups, o_fused_permutation(heads_per_group, d), -1)
    return fused.reshape(o.shape)


def permute_o_from_fused(o: torch.Tensor, num_heads: int, heads_per_group: int) -> torch.Tensor:
    """``o [..., H * D]`` fused -> ``[..., H, D]`` standard."""
    d = o.shape[-1] // num_heads
    inv = inverse_permutation(o_fused_permutation(heads_per_group, d))
    groups = o.reshape(*o.shape[:-1], num_heads // heads_per_group, heads_per_group * d)
    return permute(groups, inv, -1).reshape(*o.shape[:-1], num_heads, d)


def permute_on_load(param: torch.nn.Parameter, perm: torch.Tensor, dim: int) -> None:
    """Compose ``param.weight_loader`` with ``param.data = param.data.index_select(dim, perm)``.

    After every call of the composed loader the parameter holds the loaded
    shard permuted exactly once: the permutation reads what the inner loader
    just wrote, so a second load, or a load after a quantization hook replaced
    the inner loader, cannot leave it unpermuted or permuted twice.
    """
    inner: WeightLoader = getattr(param, "weight_loader", _default_weight_loader)
    perm = perm.clone()

    def loader(p: torch.nn.Parameter, loaded: torch.Tensor, *args, **kwargs) -> None:
        inner(p, loaded, *args, **kwargs)
        p.data.copy_(permute(p.data, perm, dim))

    param.weight_loader = loader


def _default_weight_loader(param: torch.nn.Parameter, loaded: torch.Tensor) -> None:
    """vLLM's default: copy a tensor of exactly the parameter's shape."""
    if param.shape != loaded.shape:
        raise ValueError(f"expected shape {tuple(param.shape)}, got {tuple(loaded.shape)}")
    param.data.copy_(loaded)


def permute_o_codes_from_fused(codes: torch.Tensor, num_heads: int, heads_per_group: int) -> torch.Tensor:
    """MX codes of a fused-O tensor ``[..., H * D / 32]`` -> standard ``[..., H, D / 32]`` (one per 32-chunk)."""
    chunks = codes.shape[-1] // num_heads
    inv = inverse_permutation(o_fused_chunk_permutation(heads_per_group, chunks * O_CHUNK))
    groups = codes.reshape(*codes.shape[:-1], num_heads // heads_per_group, heads_per_group * chunks)
    return permute(groups, inv, -1).reshape(*codes.shape[:-1], num_heads, chunks)
