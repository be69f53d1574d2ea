"""The layer step of docs/design.md §2 for one TP rank, in plain PyTorch: what every kernel is
checked against.

Every rounding point of the contract is explicit: MXFP8 casts through
``dsv41.common.mx``, fp32 accumulation, bf16 at the seams. The step takes the
kernel-visible (fused-layout) weights of ``LayerWeights`` and undoes the
fused layouts where it needs the standard one, so its seams are in the
standard layout a reader expects: ``q`` and ``o`` are ``[M, heads, 512]``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from dsv41.common.fused_layout import permute_o_to_fused, permute_q_from_fused
from dsv41.common.kv_cache import gather_keys
from dsv41.common.mx import dequantize_weight, mxfp8_dequantize, mxfp8_quantize
from dsv41.common.rope import apply_inverse_rope, apply_rope, rope_tables
from dsv41.common.step_inputs import StepInputs, check_compressed_cache
from dsv41.common.weights import LayerWeights


@dataclasses.dataclass
class Seams:
    """Every intermediate of one step (standard layouts; MXFP8 seams as (values, codes))."""

    x8: tuple[torch.Tensor, torch.Tensor]  # e4m3 [M, hidden], uint8 [M, hidden/32]
    qkv: torch.Tensor  # bf16 [M, q_rank + kv_dim]
    qr: torch.Tensor  # bf16 [M, q_rank]
    kv: torch.Tensor  # bf16 [M, 512], normed and RoPE'd: what was inserted
    q: torch.Tensor  # bf16 [M, heads, 512], RoPE'd
    lse: torch.Tensor  # fp32 [M, heads], -inf for a head with no valid key
    o: torch.Tensor  # bf16 [M, heads, 512], inverse-RoPE'd
    xo: tuple[torch.Tensor, torch.Tensor]  # e4m3 [M, heads, 512], uint8 [M, heads, 16]
    z: torch.Tensor  # bf16 [M, groups, o_rank]
    y: torch.Tensor  # bf16 [M, hidden]: this rank's partial


def mx_linear(x8: tuple[torch.Tensor, torch.Tensor], w: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """``dequant(x8) @ dequant(w)^T`` with fp32 accumulation -> bf16."""
    return (mxfp8_dequantize(*x8) @ dequantize_weight(w, w_scale).T).to(torch.bfloat16)


def wo_a_grouped(layer, xo_fused: torch.Tensor) -> torch.Tensor:
    """``z[:, g] = xo_fused[:, g K : (g + 1) K] @ dequant(wo_a)[g]^T`` in fp32 per group g of
    ``K = group_k`` fused O columns, bf16 ``[M, groups, o_rank]``."""
    dims = layer.dims
    wo_a = dequantize_weight(layer.wo_a, layer.wo_a_scale).view(
        dims.groups, dims.model.o_rank, dims.group_k
    )
    xo = xo_fused.float().view(xo_fused.shape[0], dims.groups, dims.group_k)
    return torch.einsum("mgk,gnk->mgn", xo, wo_a).to(torch.bfloat16)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / sqrt(mean(x^2) + eps) * weight`` in fp32, bf16 out."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(torch.bfloat16)


def attention_core(
    q: torch.Tensor, keys: torch.Tensor, valid: torch.Tensor, sink: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``o = softmax(q k^T scale) @ k * 1 / (1 + exp(sink - lse))`` over valid keys; ``(o fp32, lse fp32)``.

    ``q [M, H, D]``, ``keys [M, K, D]`` (V = K), ``valid bool [M, K]``, ``sink
    fp32 [H]`` (-inf: no sink, +inf: all weight to the sink). A token with no
    valid key gets ``o = 0`` and ``lse = -inf``; a NaN score (a NaN / Inf in x) gives NaN.
    """
    s = torch.einsum("mhd,mkd->mhk", q.float(), keys.float()) * scale
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # -inf where no key is valid
    has_key = lse != float("-inf")  # NaN (a NaN score) flows into o, as torch's softmax
    p = torch.exp(s - torch.where(has_key, lse, 0.0)[..., None])
    o = torch.einsum("mhk,mkd->mhd", p, keys.float())
    gate = torch.sigmoid(lse - sink.float())  # 1 / (1 + exp(sink - lse))
    o = torch.where(has_key[..., None], o * gate[..., None], 0.0)
    return o, lse


def reference_step(layer: LayerWeights, inputs: StepInputs) -> Seams:
    """One decode step of one rank; inserts the new records into ``window_cache`` at
    ``slot_mapping`` (``StepInputs`` says what each input holds; docs/design.md §4). Bad values
    as every backend takes them (docs/bad_inputs.md): a slot of -1 or outside the cache stores
    nothing, a position outside ``[0, max_position)`` turns nothing, a key-table entry outside
    its cache is no key, a NaN / Inf in a token's x gives that token a NaN y row."""
    check_compressed_cache(layer, inputs.compressed_cache)
    x, positions, window_cache = inputs.x, inputs.positions, inputs.window_cache
    dims, m = layer.dims, layer.dims.model
    n_tok = x.shape[0]
    cos, sin = rope_tables(m, layer.layer_id, x.device)

    x8 = mxfp8_quantize(x)
    qkv = mx_linear(x8, layer.wqkv, layer.wqkv_scale)
    qr = rmsnorm(qkv[:, : m.q_rank], layer.q_norm, m.eps)
    kv = rmsnorm(qkv[:, m.q_rank :], layer.kv_norm, m.eps)
    kv = apply_rope(kv, positions, cos, sin, m.nope_dim)
    slots = inputs.slot_mapping.long()
    store = (slots >= 0) & (slots < window_cache.num_slots)  # -1 or outside: stores nothing
    window_cache.insert(slots[store], kv[store])

    q_fused = mx_linear(mxfp8_quantize(qr), layer.wq_b, layer.wq_b_scale)
    q = permute_q_from_fused(q_fused, dims.heads, m.head_dim)
    q = apply_rope(q, positions, cos, sin, m.nope_dim)

    keys, valid = gather_keys(inputs.key_table, window_cache, inputs.compressed_cache)
    o, lse = attention_core(q, keys, valid, layer.attn_sink, m.softmax_scale)
    o = apply_inverse_rope(o, positions, cos, sin, m.nope_dim).to(torch.bfloat16)

    xo = mxfp8_quantize(o)  # standard layout, 32 values of one head per code
    xo_fused = permute_o_to_fused(mxfp8_dequantize(*xo), m.heads_per_group).flatten(-2)
    z = wo_a_grouped(layer, xo_fused)
    z8 = mxfp8_quantize(z.reshape(n_tok, dims.o_rows))
    y = mx_linear(z8, layer.wo_b, layer.wo_b_scale)
    return Seams(x8=x8, qkv=qkv, qr=qr, kv=kv, q=q, lse=lse, o=o, xo=xo, z=z, y=y)


def sum_rank_partials(partials: Sequence[torch.Tensor] | torch.Tensor) -> torch.Tensor:
    """The layer output: rank partials (a list, or stacked ``[tp, ...]`` as the distributed
    reduce gathers them) summed in fp32 in rank order, then bf16."""
    total = torch.zeros_like(partials[0], dtype=torch.float32)
    for p in partials:
        total += p.float()
    return total.to(torch.bfloat16)
