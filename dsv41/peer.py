"""The stock peer: the layer step built from the parts a user would reach for in PyTorch, for
``dsv41 bench --backend torch`` only (docs/design.md §8: the stock alternative each figure is
set beside). It is not a serving backend: not in ``dsv41.backends``, no limits, no warm-up.

Its parts: every projection a ``torch._scaled_mm`` FP8 GEMM with row-wise fp32 scales (weights
re-quantized once, when a layer is first seen, from its dequantized MXFP8 weights to e4m3 with
one scale a row, in the standard layouts; activations quantized a row at a time in the step),
RMSNorm and RoPE in torch, the new record stored and the keys gathered from the paged caches
through the key table and decoded by the package's own record code, a torch softmax with the
sink as one more logit, inverse RoPE, and the O projections a group at a time. It rounds where
those parts round, not where docs/design.md §2 says, so its y is near the reference's, not equal
(tests/test_peer.py bounds the distance). Every op is enqueue-only, so a CUDA graph captures the
step. Where this torch has no ``_scaled_mm`` for a device, a dequantized fp32 matmul stands in.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from dsv41.common.fused_layout import (
    inverse_permutation,
    o_fused_permutation,
    permute,
    q_fused_permutation,
)
from dsv41.common.kv_cache import PagedKVCache, gather_keys, pack_records
from dsv41.common.mx import E4M3, E4M3_MAX, dequantize_weight, e4m3_saturate
from dsv41.common.reference import rmsnorm
from dsv41.common.rope import apply_inverse_rope, apply_rope, rope_tables
from dsv41.common.step_inputs import StepInputs
from dsv41.common.weights import LayerWeights

RowWise = tuple[torch.Tensor, torch.Tensor]  # (e4m3 [R, K], fp32 scales [R, 1])
ColWise = tuple[torch.Tensor, torch.Tensor]  # a weight: (e4m3 [N, K], fp32 scales [1, N])


def rowwise_e4m3(x: torch.Tensor) -> RowWise:
    """``x [R, K]`` -> ``(e4m3(x / s), s)`` with ``s = amax(|row|) / 448`` fp32 ``[R, 1]`` (1 for
    a row of zeros)."""
    xf = x.float()
    amax = xf.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax / E4M3_MAX, 1.0)
    return e4m3_saturate(xf / scale), scale


@functools.cache
def _scaled_mm_runs(device_type: str) -> bool:
    """Whether this torch runs ``torch._scaled_mm`` with row-wise scales on ``device_type``."""
    try:
        a = torch.zeros(16, 16, device=device_type).to(E4M3)
        torch._scaled_mm(a, a.t(), scale_a=torch.ones(16, 1, device=device_type),
                         scale_b=torch.ones(1, 16, device=device_type), out_dtype=torch.bfloat16)
    except (AttributeError, NotImplementedError, RuntimeError):
        return False
    return True


def rowwise_weight(w: torch.Tensor) -> ColWise:
    """``rowwise_e4m3(w)`` with the scales as ``_scaled_mm``'s ``scale_b``: fp32 ``[1, N]``."""
    w8, scale = rowwise_e4m3(w)
    return w8, scale.t().contiguous()


def fp8_linear(a: RowWise, w: ColWise) -> torch.Tensor:
    """``(a8 * sa) @ (w8 * sw^T)^T`` -> bf16 ``[R, N]``: ``torch._scaled_mm`` (fp32
    accumulation), else the same product dequantized in fp32."""
    (a8, sa), (w8, sw) = a, w
    if _scaled_mm_runs(a8.device.type):
        return torch._scaled_mm(a8, w8.t(), scale_a=sa, scale_b=sw, out_dtype=torch.bfloat16)
    return dequantized_linear(a, w)


def dequantized_linear(a: RowWise, w: ColWise) -> torch.Tensor:
    """``fp8_linear``'s product dequantized in fp32, bf16 out."""
    (a8, sa), (w8, sw) = a, w
    return ((a8.float() * sa) @ (w8.float() * sw.t()).t()).to(torch.bfloat16)


@dataclasses.dataclass(frozen=True)
class PeerWeights:
    """A rank's projections re-quantized row-wise, standard layouts (no fused Q / O order)."""

    wqkv: ColWise  # [q_rank + kv_dim, hidden]
    wq_b: ColWise  # [heads * 512, q_rank], head-major rows
    wo_a: tuple[ColWise, ...]  # a group each: [o_rank, 8 * 512], head-major columns
    wo_b: ColWise  # [hidden, groups * o_rank]

    @classmethod
    def build(cls, layer: LayerWeights) -> PeerWeights:
        """From ``layer``'s dequantized weights, the fused layouts undone."""
        dims, m = layer.dims, layer.dims.model
        wq_b = dequantize_weight(layer.wq_b, layer.wq_b_scale)
        wq_b = permute(wq_b, inverse_permutation(q_fused_permutation(dims.heads, m.head_dim)), 0)
        wo_a = dequantize_weight(layer.wo_a, layer.wo_a_scale)
        o_inv = inverse_permutation(o_fused_permutation(m.heads_per_group, m.head_dim))
        wo_a = permute(wo_a, o_inv, 1).view(dims.groups, m.o_rank, dims.group_k)
        return cls(
            wqkv=rowwise_weight(dequantize_weight(layer.wqkv, layer.wqkv_scale)),
            wq_b=rowwise_weight(wq_b),
            wo_a=tuple(rowwise_weight(w) for w in wo_a),
            wo_b=rowwise_weight(dequantize_weight(layer.wo_b, layer.wo_b_scale)),
        )


def _store_records(cache: PagedKVCache, slots: torch.Tensor, kv: torch.Tensor) -> None:
    """``kv [M, 512]`` stored at ``slots``; a slot outside the cache (-1) stores nothing (its
    write puts slot 0's own record back)."""
    inside = (slots >= 0) & (slots < cache.num_slots)
    at = torch.where(inside, slots.long(), 0)
    new = pack_records(kv, cache.fmt)
    cache.scatter_records(at, torch.where(inside[:, None], new, cache.gather_records(at)))


def sink_attention(q: torch.Tensor, keys: torch.Tensor, valid: torch.Tensor, sink: torch.Tensor,
                   scale: float) -> torch.Tensor:  # fmt: skip
    """``softmax([q k^T scale, sink]) @ k`` without the sink's column, bf16 ``[M, heads, 512]``:
    ``q`` bf16 ``[M, heads, 512]``, ``keys`` bf16 ``[M, KEYS, 512]`` (V = K), ``valid`` bool
    ``[M, KEYS]``, ``sink`` fp32 ``[heads]``; bf16 matmuls, an fp32 softmax."""
    scores = torch.matmul(q, keys.transpose(1, 2)).float() * scale  # [M, heads, KEYS]
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    sinks = sink.float().view(1, -1, 1).expand(q.shape[0], -1, 1)
    p = torch.softmax(torch.cat([scores, sinks], dim=-1), dim=-1)[..., :-1]
    return torch.matmul(p.to(torch.bfloat16), keys)


def peer_step(layer: LayerWeights, inputs: StepInputs, weights: PeerWeights) -> torch.Tensor:
    """One step of the stock peer: the rank's bf16 y ``[M, hidden]``; inserts the new records."""
    dims, m = layer.dims, layer.dims.model
    x, positions = inputs.x, inputs.positions
    tokens = x.shape[0]
    cos, sin = rope_tables(m, layer.layer_id, x.device)
    qkv = fp8_linear(rowwise_e4m3(x), weights.wqkv)
    qr = rmsnorm(qkv[:, : m.q_rank], layer.q_norm, m.eps)
    kv = apply_rope(rmsnorm(qkv[:, m.q_rank :], layer.kv_norm, m.eps), positions, cos, sin,
                    m.nope_dim)  # fmt: skip
    _store_records(inputs.window_cache, inputs.slot_mapping, kv)
    q = fp8_linear(rowwise_e4m3(qr), weights.wq_b).view(tokens, dims.heads, m.head_dim)
    q = apply_rope(q, positions, cos, sin, m.nope_dim)
    keys, valid = gather_keys(inputs.key_table, inputs.window_cache, inputs.compressed_cache)
    keys = keys.to(torch.bfloat16)
    o = sink_attention(q, keys, valid, layer.attn_sink, m.softmax_scale)
    o = apply_inverse_rope(o, positions, cos, sin, m.nope_dim)
    o = o.view(tokens, dims.groups, dims.group_k)
    z = torch.cat([fp8_linear(rowwise_e4m3(o[:, g]), w) for g, w in enumerate(weights.wo_a)], dim=1)
    return fp8_linear(rowwise_e4m3(z), weights.wo_b)


class TorchPeer:
    """``peer(layer, inputs) -> y``: ``peer_step`` with each layer's ``PeerWeights`` built the
    first time the layer is seen (the bench's run before its graph capture) and kept."""

    def __init__(self) -> None:
        self._weights: dict[int, tuple[LayerWeights, PeerWeights]] = {}

    def __call__(self, layer: LayerWeights, inputs: StepInputs) -> torch.Tensor:
        held = self._weights.get(id(layer))
        if held is None or held[0] is not layer:
            held = self._weights[id(layer)] = (layer, PeerWeights.build(layer))
        return peer_step(layer, inputs, held[1])
