"""The step-argument checks every backend shares: each bad argument is named, nothing launches."""

import dataclasses

import pytest
import torch

from dsv41.amd.mono.launcher import MonoError, mono_step
from dsv41.common.geometry import Dims
from dsv41.common.scenario import make_scenario
from dsv41.common.step_inputs import check_step_inputs
from dsv41.common.weights import LayerWeights
from dsv41.nvidia.step import nvidia_step


@pytest.fixture(scope="module")
def layer() -> LayerWeights:
    lw = LayerWeights(Dims.of("tiny", 2), rank=0, layer_id=1)
    lw.dummy_load(seed=3)
    return lw


@pytest.fixture(scope="module")
def scenario(layer):
    return make_scenario(layer.dims, 1, 3, seed=5)


def _bad_cases(sc):
    """``(field, replacement, message pattern)``: one wrong argument each."""
    x = sc.x
    wide = torch.empty(x.shape[0], 2 * x.shape[1], dtype=x.dtype)[:, ::2]
    return [
        ("x", x.float(), r"x: expected bfloat16 \[M, 256\], got torch.float32"),
        ("x", x[:, :128], r"x: expected bfloat16 \[M, 256\]"),
        ("x", wide, r"x: expected a unit stride along hidden"),
        ("positions", sc.positions[:2], r"positions: expected int32 or int64 \[3\]"),
        ("slot_mapping", sc.slot_mapping.float(), r"slot_mapping: expected int32 or int64 \[3\]"),
        ("key_table", sc.key_table.long(), r"key_table: expected int32 \[3, KEYS\]"),
        ("key_table", sc.key_table[:1], r"key_table: expected int32 \[3, KEYS\]"),
        ("window_cache", sc.window_cache.data, r"window_cache: expected a PagedKVCache, got Tensor"),
        ("compressed_cache", "none", r"compressed_cache: expected a PagedKVCache, got str"),
        ("positions", sc.positions.to("meta"), r"positions: expected a tensor on the weights' cpu"),
    ]


def test_good_inputs_give_m(layer, scenario):
    assert check_step_inputs(layer, scenario) == 3


@pytest.mark.parametrize("case", range(10))
def test_each_bad_argument_is_named_by_every_entry_point(layer, scenario, case):
    """The shared check, nvidia_step and mono_step (validating) reject it with the same words,
    before anything runs (the window cache is unchanged)."""
    field, value, pattern = _bad_cases(scenario)[case]
    bad = dataclasses.replace(scenario, **{field: value})
    before = scenario.window_cache.data.clone()
    with pytest.raises((TypeError, ValueError), match=pattern):
        check_step_inputs(layer, bad)
    with pytest.raises((TypeError, ValueError), match=pattern):
        nvidia_step(layer, bad)
    with pytest.raises(MonoError, match=pattern):
        mono_step(layer, bad, validate=True)
    assert torch.equal(scenario.window_cache.data, before)
