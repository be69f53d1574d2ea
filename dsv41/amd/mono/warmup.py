"""Warm-up: compile every mono kernel variant a server dispatches, up front.

A mono launch's constexprs follow the step's token count through its plan (the token rows a
GEMV tile carries and the GEMV tiling), so token counts with the same ones share a compiled
kernel. ``warmup`` runs one step of each distinct variant up to ``max_tokens`` on random
inputs of the layer's geometry and device (on CPU: under the interpreter, for tests).
"""

from __future__ import annotations

import time

import torch

from dsv41.amd.mono.launcher import runner_for
from dsv41.amd.mono.plan import MAX_TOKENS, Plan
from dsv41.common.scenario import make_scenario
from dsv41.common.weights import LayerWeights


def variants(layer: LayerWeights, max_tokens: int) -> list[int]:
    """The smallest token count of each distinct compiled variant up to ``max_tokens``."""
    if not 1 <= max_tokens <= MAX_TOKENS:
        raise ValueError(f"max_tokens: expected 1 .. {MAX_TOKENS}, got {max_tokens}")
    seen: dict[tuple, int] = {}
    for tokens in range(1, max_tokens + 1):
        plan = Plan(layer.dims, tokens)
        key = (plan.token_block, tuple(sorted(plan.tiling.items())), plan.key_slice)
        seen.setdefault(key, tokens)
    return sorted(seen.values())


def warmup(layer: LayerWeights, max_tokens: int) -> dict[tuple[str, int], float]:
    """Run one step of each variant (``variants``); seconds per ("mono", tokens)."""
    device = layer.wqkv.device
    window = layer.dims.model.window
    seconds: dict[tuple[str, int], float] = {}
    for tokens in variants(layer, max_tokens):
        sc = make_scenario(layer.dims, layer.layer_id, tokens, seed=tokens, device=device,
                           max_context=window)  # fmt: skip
        runner = runner_for(layer, tokens)
        start = time.perf_counter()
        runner.launch(sc, torch.empty_like(sc.x))
        runner.check()  # syncs
        seconds[("mono", tokens)] = time.perf_counter() - start
    return seconds
