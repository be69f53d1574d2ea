"""The NVIDIA step's launch choices as data: one frozen ``Tuning`` a (GPU, tp share, token
bucket).

``tuning_for(dims, device, tokens)`` resolves it once a (device, geometry, bucket) and the step
passes it down to each of its launches; ``dsv41 plan`` prints it. Every choice is a function of
the token bucket ``bucket_for(M)``, not M, so a warmed-up bucket has every kernel variant
compiled. The one switch read here is ``DSV41_PDL`` (A/B runs of programmatic dependent launch).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TypeVar

import torch

from dsv41.common import switches
from dsv41.common.geometry import Dims
from dsv41.common.platform import Platform, current_platform
from dsv41.nvidia.ops.launch import bucket_for, sm_count
from dsv41.nvidia.ops.mega_attention import AttentionTuning, attention_tuning
from dsv41.nvidia.ops.mx_gemm import (
    GEMV,
    PRELOAD_BLOCK_K,
    PRELOAD_MAX_M,
    PRELOAD_PROGRAMS_PER_SM,
    GemmConfig,
    GemvRules,
    gemm_config,
)
from dsv41.nvidia.ops.pdl import pdl_enabled

GEMM_SITES = ("wqkv", "wq_b", "wo_a", "wo_b")
D = TypeVar("D")  # a Tuning or a dataclass nested in it


def gemm_shapes(dims: Dims) -> dict[str, tuple[int, int, int | None, bool]]:
    """Per GEMM site of a rank: ``(N, K, N per group or None, MXFP8 out)`` as ``mx_gemm`` runs
    it."""
    m = dims.model
    return {
        "wqkv": (m.qkv_rows, m.hidden, None, False),  # 1792 x 5120
        "wq_b": (dims.q_rows, m.q_rank, None, False),  # heads * 512 x 1280
        "wo_a": (dims.o_rows, dims.group_k, m.o_rank, True),  # grouped, z re-quantized
        "wo_b": (m.hidden, dims.o_rows, None, False),
    }


@dataclasses.dataclass(frozen=True)
class Tuning:
    """Every launch choice of one step of a token bucket on one GPU at one tp share."""

    bucket: int  # the token bucket (M rounded up to M_BUCKETS)
    sms: int  # multiprocessors the launches plan for
    pdl: bool  # programmatic dependent launch between the step's kernels
    # wq_b normalises qr in its prologue (its CUDA-core loop), the norm kernel's kv half beside
    # it on a side stream, and its programs ask the L2 for attention's records before their wait
    norm_in_wq_b: bool
    # z's MXFP8 cast in wo_b's prologue (which stores z8), so wo_a takes whole rows
    z_cast_in_wo_b: bool
    wqkv: GemmConfig
    wq_b: GemmConfig
    wo_a: GemmConfig
    wo_b: GemmConfig
    attention: AttentionTuning

    def rows(self) -> list[tuple[str, str]]:
        """``(name, value)`` lines for ``dsv41 plan``."""
        out = [("bucket", str(self.bucket)), ("sms", str(self.sms)), ("pdl", str(self.pdl)),
               ("norm_in_wq_b", str(self.norm_in_wq_b)),
               ("z_cast_in_wo_b", str(self.z_cast_in_wo_b))]  # fmt: skip
        for site in GEMM_SITES:
            c = getattr(self, site)
            loop = "cuda-core" if c.gemv else "mma on bf16 a"
            if c.code_words:
                loop += ", code words"
            if c.weights_a:
                loop += ", weights the A operand"
            if c.preload:
                loop += ", one K step read before the wait"
            out.append((site, f"{loop} block {c.block_m}x{c.block_n}x{c.block_k} split_k "
                              f"{c.split_k} k_steps {c.k_steps} k_tail {c.k_tail} warps "
                              f"{c.num_warps} stages {c.num_stages}"))  # fmt: skip
        a = self.attention
        parts = [f"splits {a.splits} x {a.keys_per_split} keys", f"qk_split {a.qk_split}",
                 f"alone {a.alone}", f"combine {a.combine_heads} heads"
                 + (" wide" if a.combine_wide else ""), f"{a.key_block}-key dots"]  # fmt: skip
        if a.max_registers:
            parts.append(f"{a.max_registers} registers")
        if a.keys_a:
            parts.append("keys the A operand")
        out.append(("attention", ", ".join(parts)))
        return out

    def dequantized(self, site: str) -> bool:
        """Whether GEMM ``site`` reads its activation as bf16 values its producer dequantized once
        (the MMA loop: its K steps then convert only weights)."""
        return not getattr(self, site).gemv


def resolve(dims: Dims, sms: int, tokens: int, *, rules: GemvRules = GEMV,
            pdl: bool | None = None) -> Tuning:  # fmt: skip
    """The tuning of a step of ``tokens`` tokens (its bucket's) at ``dims`` on ``sms`` SMs;
    ``pdl`` None: on up to ``PDL_MAX_TOKENS`` tokens where every GEMM reads its weights before
    the wait (off in the interpreter)."""
    bucket = bucket_for(tokens)
    shapes = gemm_shapes(dims)
    preload = _preload(dims, bucket, sms, rules)

    def config(site: str, quant_out: bool) -> GemmConfig:
        n, k, npg, _ = shapes[site]
        return gemm_config(bucket, n, k, n_per_group=npg or n, quant_out=quant_out, sms=sms,
                           rules=rules, preload=preload)  # fmt: skip

    wo_a_whole = config("wo_a", quant_out=False)
    wo_b = config("wo_b", quant_out=False)
    # An MXFP8 epilogue needs 32-row tiles (so split K); casting z in wo_b lets wo_a's CUDA-core
    # loop take whole rows, where wo_b runs the CUDA-core loop too.
    z_cast = wo_a_whole.gemv and wo_a_whole.split_k == 1 and wo_b.gemv
    wq_b = config("wq_b", quant_out=False)
    return Tuning(
        bucket=bucket,
        sms=sms,
        pdl=(pdl_enabled(bucket, bucket <= rules.max_m or preload > 0) if pdl is None
             else pdl and current_platform().pdl),
        norm_in_wq_b=wq_b.gemv,
        z_cast_in_wo_b=z_cast,
        wqkv=config("wqkv", quant_out=False),
        wq_b=wq_b,
        wo_a=wo_a_whole if z_cast else config("wo_a", quant_out=True),
        wo_b=wo_b,
        attention=attention_tuning(bucket, dims.heads, dims.model.keys, sms),
    )


def _preload(dims: Dims, bucket: int, sms: int, rules: GemvRules) -> int:
    """``PRELOAD_BLOCK_K`` where a step of ``bucket`` tokens runs the MMA loop with PDL and each
    GEMM's one-K-step grid fits ``PRELOAD_PROGRAMS_PER_SM`` programs a SM; else 0."""
    if not (rules.max_m < bucket <= PRELOAD_MAX_M and pdl_enabled(bucket)):
        return 0
    for n, k, npg, quant in gemm_shapes(dims).values():
        c = gemm_config(bucket, n, k, n_per_group=npg or n, quant_out=quant, sms=sms,
                        gemv_ok=False, preload=PRELOAD_BLOCK_K)  # fmt: skip
        if -(-n // c.block_n) * c.split_k > PRELOAD_PROGRAMS_PER_SM * sms:
            return 0
    return PRELOAD_BLOCK_K


def preload_changes(dims: Dims, tokens: int, columns: int) -> dict[str, object]:
    """``changed`` fields putting each MMA site of ``tokens``'s bucket on one K step a program of
    at most ``columns`` columns, its weights read before the PDL wait (``GemmConfig.preload``;
    A/B runs: ``dsv41 bench --variant``)."""
    out: dict[str, object] = {}
    for site, (n, k, npg, quant) in gemm_shapes(dims).items():
        c = gemm_config(tokens, n, k, n_per_group=npg or n, quant_out=quant, sms=1,
                        block_k_max=columns, gemv_ok=False, preload=columns)  # fmt: skip
        out |= {f"{site}.{f}": getattr(c, f) for f in ("preload", "block_k", "split_k",
                                                       "num_stages")}  # fmt: skip
    return out


@functools.cache
def _cached(dims: Dims, sms: int, bucket: int, pdl: bool | None, platform: Platform) -> Tuning:
    return resolve(dims, sms, bucket)  # pdl and platform: the cache key of what resolve reads


def tuning_for(dims: Dims, device: torch.device, tokens: int) -> Tuning:
    """``resolve`` for ``device``'s SM count, once a (geometry, SM count, bucket, platform,
    ``DSV41_PDL``)."""
    return _cached(dims, sm_count(device), bucket_for(tokens), switches.pdl(),
                   current_platform())  # fmt: skip


def changed(tuning: D, changes: dict[str, object]) -> D:
    """``tuning`` (a ``Tuning`` or a dataclass nested in it) with ``changes`` applied by
    ``dataclasses.replace``, a dotted name reaching a nested field: ``{"pdl": False,
    "wo_a.block_k": 128}`` (A/B runs, ``dsv41 bench --variant``)."""
    top: dict[str, object] = {}
    nested: dict[str, dict[str, object]] = {}
    for name, value in changes.items():
        head, dot, rest = name.partition(".")
        if dot:
            nested.setdefault(head, {})[rest] = value
        else:
            top[head] = value
    for head, sub in nested.items():
        top[head] = changed(getattr(tuning, head), sub)
    return dataclasses.replace(tuning, **top)
