"""Shared mono fixtures: tiny-geometry layers, a launch through a runner, the reference step."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dsv41.amd.mono.launcher import MonoRunner
from dsv41.common.geometry import Dims
from dsv41.common.reference import Seams, reference_step
from dsv41.common.weights import LayerWeights
from dsv41.config import load_model_config

TINY = load_model_config("tiny")


@pytest.fixture(scope="session")
def tiny_layer():
    """``tiny_layer(tp, layer_id, hidden=256, q_rank=128, heads=32)``: the last rank's random
    weights of the tiny model (``hidden`` widened to make x span several xq / GEMV blocks,
    ``q_rank`` off a power of two to end wq_b's K in a partial block, ``heads`` doubled to give
    a rank two head tiles, with a group every 8 heads as in the model), built once a session."""
    layers: dict[tuple[int, int, int, int, int], LayerWeights] = {}

    def get(tp: int, layer_id: int, hidden: int = TINY.hidden, q_rank: int = TINY.q_rank,
            heads: int = TINY.n_heads) -> LayerWeights:
        key = (tp, layer_id, hidden, q_rank, heads)
        if key not in layers:
            model = dataclasses.replace(TINY, hidden=hidden, q_rank=q_rank, n_heads=heads,
                                        o_groups=heads // TINY.heads_per_group)
            lw = LayerWeights(Dims.of(model, tp), tp - 1, layer_id)
            lw.dummy_load(seed=100 + 10 * tp + layer_id)
            layers[key] = lw
        return layers[key]

    return get


@pytest.fixture(scope="session")
def run_reference():
    """``run_reference(lw, sc)``: the reference step on private copies of the scenario's caches."""

    def run(lw: LayerWeights, sc) -> Seams:
        sc = sc.clone_caches()
        return reference_step(lw, sc)

    return run


@pytest.fixture(scope="session")
def run_mono():
    """``run_mono(runner, sc)``: one checked launch (into the scenario's caches); the seams."""

    def run(runner: MonoRunner, sc) -> dict:
        y = torch.empty_like(sc.x)
        runner.launch(sc, y)
        runner.check()
        return runner.seams(y)

    return run
