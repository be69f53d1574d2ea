"""After Wqkv, a program a token: RMSNorms, RoPE on kv, record insert, MXFP8 of qr (docs/design.md
§2.2-2.4).

``qr = rmsnorm(qkv[:q_rank]) * q_norm`` and ``kv = rmsnorm(qkv[q_rank:]) *
kv_norm`` in fp32, each rounded to bf16; kv's dims ``nope..`` turn forward by
the token's position (GPT-J pairs, then bf16 again) and the record goes into
the window cache at ``slot_mapping`` (a slot outside the cache is skipped);
``qr`` leaves as MXFP8 (values + codes), the activation of ``wq_b`` (unless
wq_b normalises qr itself: then no q half), and, for a wq_b whose MMA loop reads it
dequantized, as those values dequantized to bf16. The position, RoPE angles and slot
are read first, as nothing in the step writes them. The pair
partner of a rope dim is normalized from its own load with the same
``rsqrt`` factor, so it is bit-identical to the value the partner's lane holds.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41.common.kv_cache import PagedKVCache
from dsv41.common.kv_records_tl import fmt_id, store_record_tl
from dsv41.common.mx import E4M3, MX_BLOCK, bf16_round_tl, mx_dequantize_tl, mx_quantize_tl
from dsv41.common.norm_tl import kv_angles_tl, kv_normed_tl, rms_factor_tl
from dsv41.common.platform import current_platform
from dsv41.nvidia.ops.pdl import pdl_enabled, pdl_launch_options, pdl_prologue_tl


@triton.jit
def norm_rope_insert_kernel(
    qkv_ptr,
    q_norm_ptr,
    kv_norm_ptr,
    pos_ptr,
    slot_ptr,
    cos_ptr,
    sin_ptr,
    cache_ptr,
    kv_ptr,
    qr8_ptr,
    qr8_codes_ptr,
    qr_deq_ptr,
    num_slots,
    max_pos,
    eps,
    stride_qkv,
    stride_kv,
    stride_qr8,
    stride_qr8c,
    stride_qrd,
    Q_RANK: tl.constexpr,
    Q_PAD: tl.constexpr,
    KV_DIM: tl.constexpr,
    NOPE: tl.constexpr,
    HALF_ROPE: tl.constexpr,
    BLOCK_TOKENS: tl.constexpr,
    FMT: tl.constexpr,
    USE_PDL: tl.constexpr = False,
    QR8: tl.constexpr = True,
    QR_DEQ: tl.constexpr = False,
):
    """qr8 = mxfp8(bf16(rmsnorm(q) q_norm)) (with ``QR8``; ``QR_DEQ``: its values dequantized
    to bf16 too); kv = bf16(rope(bf16(rmsnorm(kv)
    kv_norm))) -> cache."""
    pdl_prologue_tl(USE_PDL)
    t = tl.program_id(0)
    row = qkv_ptr + t.to(tl.int64) * stride_qkv
    # What no step kernel writes first: the token's position, its RoPE angles and its slot.
    pos = tl.load(pos_ptr + t).to(tl.int64)
    cs, sn = kv_angles_tl(pos, max_pos, cos_ptr, sin_ptr, KV_DIM, NOPE, HALF_ROPE)
    slot = tl.load(slot_ptr + t + tl.arange(0, 1)).to(tl.int64)
    if QR8:  # q half: norm, bf16, MXFP8.
        dq = tl.arange(0, Q_PAD)
        q_ok = dq < Q_RANK
        q = tl.load(row + dq, mask=q_ok, other=0.0).to(tl.float32)
        qn = (
            q
            * rms_factor_tl(q, Q_RANK, eps)
            * tl.load(q_norm_ptr + dq, mask=q_ok, other=0.0).to(tl.float32)
        )
        qn = bf16_round_tl(qn)
        v, c = mx_quantize_tl(tl.reshape(qn, (1, Q_PAD)), 1, Q_PAD)
        tl.store(qr8_ptr + t.to(tl.int64) * stride_qr8 + dq, tl.reshape(v, (Q_PAD,)), mask=q_ok)
        g = tl.arange(0, Q_PAD // 32)
        tl.store(
            qr8_codes_ptr + t.to(tl.int64) * stride_qr8c + g,
            tl.reshape(c, (Q_PAD // 32,)).to(tl.uint8),
            mask=g < Q_RANK // 32,
        )
        if QR_DEQ:
            deq = tl.reshape(mx_dequantize_tl(v, c, 1, Q_PAD), (Q_PAD,)).to(tl.bfloat16)
            tl.store(qr_deq_ptr + t.to(tl.int64) * stride_qrd + dq, deq, mask=q_ok)
    # kv half: norm, bf16, RoPE on nope.., bf16, insert.
    kv = kv_normed_tl(row + Q_RANK, kv_norm_ptr, cs, sn, eps, KV_DIM, NOPE)
    d = tl.arange(0, KV_DIM)
    tl.store(kv_ptr + t.to(tl.int64) * stride_kv + d, kv.to(tl.bfloat16))
    store_record_tl(cache_ptr, slot, tl.reshape(kv, (1, KV_DIM)), num_slots, BLOCK_TOKENS, FMT)


def norm_rope_insert(
    qkv: torch.Tensor,
    q_norm: torch.Tensor,
    kv_norm: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    window_cache: PagedKVCache,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    eps: float,
    nope: int,
    kv: torch.Tensor,
    qr8: tuple[torch.Tensor, torch.Tensor] | None,
    qr_deq: torch.Tensor | None = None,
    pdl: bool | None = None,
) -> None:
    """Fill ``kv`` bf16 [M, 512] and ``qr8`` (e4m3 [M, q_rank], uint8 [M, q_rank/32]; None: no
    q half, for a wq_b that normalises qr itself); insert kv. ``qr_deq`` (bf16 [M, q_rank], with
    ``qr8``) receives qr8's values dequantized.

    ``qkv`` bf16 [M, q_rank + kv_dim] (the Wqkv output); ``positions`` /
    ``slot_mapping`` [M] int; ``cos`` / ``sin`` fp32 [max_position, rope_dim/2].
    ``pdl``: a step's ``Tuning`` passes it; None picks it for M.
    """
    m = qkv.shape[0]
    q_rank, kv_dim = q_norm.shape[0], kv_norm.shape[0]
    expect = {
        "qkv": (qkv, torch.bfloat16, (m, q_rank + kv_dim)),
        "kv": (kv, torch.bfloat16, (m, kv_dim)),
    }
    if qr8 is not None:
        expect["qr8 values"] = (qr8[0], E4M3, (m, q_rank))
        expect["qr8 codes"] = (qr8[1], torch.uint8, (m, q_rank // MX_BLOCK))
    if qr_deq is not None:
        if qr8 is None:
            raise ValueError("qr_deq: expected it with qr8 (it receives qr8's values "
                             "dequantized), got no qr8")  # fmt: skip
        expect["qr_deq"] = (qr_deq, torch.bfloat16, (m, q_rank))
    for name, (t, dtype, shape) in expect.items():
        if t.dtype != dtype or tuple(t.shape) != shape or t.stride(-1) != 1:
            raise ValueError(
                f"{name}: expected {dtype} {list(shape)} (unit last stride), "
                f"got {t.dtype} {list(t.shape)}"
            )
    for name, t in (("positions", positions), ("slot_mapping", slot_mapping)):
        if tuple(t.shape) != (m,):
            raise ValueError(f"{name}: expected [{m}], got {list(t.shape)}")
    pdl = pdl_enabled(m) if pdl is None else pdl and current_platform().pdl
    norm_rope_insert_kernel[(m,)](
        qkv,
        q_norm,
        kv_norm,
        positions,
        slot_mapping,
        cos,
        sin,
        window_cache.data,
        kv,
        qr8[0] if qr8 is not None else kv,
        qr8[1] if qr8 is not None else kv,
        qr_deq if qr_deq is not None else kv,
        window_cache.num_slots,
        cos.shape[0],
        eps,
        qkv.stride(0),
        kv.stride(0),
        qr8[0].stride(0) if qr8 is not None else 0,
        qr8[1].stride(0) if qr8 is not None else 0,
        qr_deq.stride(0) if qr_deq is not None else 0,
        Q_RANK=q_rank,
        Q_PAD=triton.next_power_of_2(q_rank),
        KV_DIM=kv_dim,
        NOPE=nope,
        HALF_ROPE=cos.shape[1],
        BLOCK_TOKENS=window_cache.block,
        FMT=fmt_id(window_cache.fmt),
        num_warps=4,
        USE_PDL=pdl,
        QR8=qr8 is not None,
        QR_DEQ=qr_deq is not None,
        **pdl_launch_options(pdl),
    )
