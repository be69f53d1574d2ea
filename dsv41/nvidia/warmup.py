"""Warm-up: compile every kernel variant the NVIDIA backend dispatches, up front (docs/design.md
§6).

A kernel variant is fixed by its constexprs, and every launcher picks those
from the token bucket ``bucket_for(M)`` (``M_BUCKETS``: decode 1..48, prefill
64..512), never from M itself, whose value the kernels do not specialize on.
So running each registered entry point once per bucket compiles everything a
server will dispatch for M up to the last bucket. ``REGISTRY`` lists the entry
points with the buckets each serves; ``warmup`` runs them on random inputs of
the layer's geometry and device (on CPU: under the interpreter, for tests).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable

import torch

from dsv41.common.scenario import Scenario, make_scenario
from dsv41.common.weights import LayerWeights
from dsv41.nvidia.ops.launch import M_BUCKETS, bucket_for
from dsv41.nvidia.ops.mx_gemm import mx_gemm, scratch_for
from dsv41.nvidia.ops.o_proj import can_fuse_wo_a, wo_a_from_o
from dsv41.nvidia.step import nvidia_step

DECODE_BUCKETS = tuple(b for b in M_BUCKETS if b <= 48)  # 1, 2, 4, 8, 16, 32, 48
PREFILL_BUCKETS = tuple(b for b in M_BUCKETS if b > 48)  # 64, 128, 256, 512
SM100_MAJOR = 10  # the SM100 family stores fp8_mx records; SM90 fp8_ds_mla (docs/design.md §4)


@dataclasses.dataclass(frozen=True)
class Variant:
    """An entry point to compile: which token counts it serves and how to run it once."""

    name: str
    serves: Callable[[LayerWeights, int], bool]
    run: Callable[[LayerWeights, Scenario], object]


def _step(layer: LayerWeights, sc: Scenario) -> object:
    return nvidia_step(layer, sc)


def _o_proj(fused: bool) -> Callable[[LayerWeights, Scenario], object]:
    def run(layer: LayerWeights, sc: Scenario) -> object:
        model = layer.dims.model
        o = sc.x.new_zeros(sc.x.shape[0], layer.dims.heads, model.head_dim).normal_()
        _, z8 = wo_a_from_o(layer, o, sc.positions, fused=fused)
        return mx_gemm(z8, layer.wo_b, layer.wo_b_scale, scratch=scratch_for("wo_b"))

    return run


REGISTRY: tuple[Variant, ...] = (
    Variant("step", lambda layer, m: True, _step),
    Variant("o_proj fused", can_fuse_wo_a, _o_proj(fused=True)),
    Variant("o_proj grouped", lambda layer, m: not can_fuse_wo_a(layer, m), _o_proj(fused=False)),
)


def default_record_format(device: torch.device) -> str:
    """fp8_mx on the SM100 family, fp8_ds_mla elsewhere."""
    if device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= SM100_MAJOR:
        return "fp8_mx"
    return "fp8_ds_mla"


def warmup(
    layer: LayerWeights,
    buckets: Iterable[int] = DECODE_BUCKETS + PREFILL_BUCKETS,
    *,
    fmt: str | None = None,
) -> dict[tuple[str, int], float]:
    """Run each registered entry point once per bucket it serves; seconds per (name, bucket)."""
    device = layer.wqkv.device
    fmt = fmt or default_record_format(device)
    window = layer.dims.model.window
    seconds: dict[tuple[str, int], float] = {}
    for m in buckets:
        if m not in M_BUCKETS:
            raise ValueError(f"buckets: expected values from {M_BUCKETS}, got {m}")
        sc = make_scenario(
            layer.dims, layer.layer_id, m, fmt=fmt, seed=m, device=device, max_context=window
        )
        for variant in REGISTRY:
            if variant.serves(layer, m):
                start = time.perf_counter()
                variant.run(layer, sc)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                seconds[(variant.name, m)] = time.perf_counter() - start
    return seconds


def warmup_up_to(layer: LayerWeights, max_tokens: int) -> dict[tuple[str, int], float]:
    """``warmup`` of every bucket a step of up to ``max_tokens`` tokens dispatches (those up to
    ``bucket_for(max_tokens)``), in the device's record format."""
    last = bucket_for(max_tokens)
    return warmup(layer, [b for b in M_BUCKETS if b <= last])
