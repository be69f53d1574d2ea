"""The RMSNorm factor as a device helper, shared by both backends (docs/design.md §2.2), and a
token's
new key (docs/design.md §2.2-2.3: kv normalised, then RoPE'd) as nvidia's norm kernel makes it.

``reference.rmsnorm`` scales by ``torch.rsqrt(mean(x^2) + eps)``; kernels take
the factor from here (``tl.rsqrt``, the same hardware reciprocal square root
on a GPU) rather than each spelling it their own way.
"""

from __future__ import annotations

import triton
import triton.language as tl

from dsv41.common.mx import bf16_round_tl
from dsv41.common.rope import rope_pair_tl


@triton.jit
def rms_factor_tl(x, n: tl.constexpr, eps):
    """``1 / sqrt(sum(x^2) / n + eps)`` over the lanes of ``x`` (lanes past ``n`` hold 0)."""
    return rms_factor_of_tl(tl.sum(x * x, axis=0), n, eps)


@triton.jit
def rms_factor_of_tl(squares, n: tl.constexpr, eps):
    """``1 / sqrt(squares / n + eps)``: the factor from a row's sum of squares (a kernel that
    holds the row in pieces sums each piece's squares)."""
    return tl.rsqrt(squares / n + eps)


@triton.jit
def kv_angles_tl(pos, max_pos, cos_ptr, sin_ptr, KV_DIM: tl.constexpr, NOPE: tl.constexpr,
                 HALF_ROPE: tl.constexpr):  # fmt: skip
    """``(cos, sin) [KV_DIM]``: each lane's RoPE angle at ``pos`` (its GPT-J pair's, lanes
    ``NOPE..``); (1, 0) for the nope lanes and for a position outside ``[0, max_pos)``, so no
    table is read out of bounds. Nothing in a step writes them: read before a PDL wait."""
    d = tl.arange(0, KV_DIM)
    pair = tl.where(d >= NOPE, (d - NOPE) // 2, -1)  # each lane's rope pair, -1 for nope lanes
    # (a bool tensor from a tensor, not `tensor & scalar`: the interpreter's masks need it)
    turn = tl.where((pos >= 0) & (pos < max_pos), pair, -1) >= 0
    at = pos.to(tl.int64) * HALF_ROPE + tl.where(turn, pair, 0)
    return tl.load(cos_ptr + at, mask=turn, other=1.0), tl.load(sin_ptr + at, mask=turn, other=0.0)


@triton.jit
def kv_normed_tl(kv_ptr, kv_norm_ptr, cs, sn, eps, KV_DIM: tl.constexpr, NOPE: tl.constexpr):
    """A token's new key, fp32 ``[KV_DIM]`` holding bf16 values: ``bf16(rope(bf16(rmsnorm(kv)
    kv_norm)))`` of the bf16 kv half at ``kv_ptr``, turned by ``(cs, sn)`` (``kv_angles_tl``).
    The pair partner of a rope lane is normalised from its own load with the same factor, so it
    is bit for bit the value the partner's lane holds."""
    d = tl.arange(0, KV_DIM)
    p = d ^ 1
    kv = tl.load(kv_ptr + d).to(tl.float32)
    scale = rms_factor_tl(kv, KV_DIM, eps)
    kv = bf16_round_tl(kv * scale * tl.load(kv_norm_ptr + d).to(tl.float32))
    partner = tl.load(kv_ptr + p).to(tl.float32)
    partner = bf16_round_tl(partner * scale * tl.load(kv_norm_ptr + p).to(tl.float32))
    even = d % 2 == 0
    r0, r1 = rope_pair_tl(tl.where(even, kv, partner), tl.where(even, partner, kv), cs, sn, False)
    return bf16_round_tl(tl.where(d >= NOPE, tl.where(even, r0, r1), kv))
