"""The mono kernel over several steps (Triton interpreter on CPU, tiny geometry): one scratch
never cleared, the epoch wrapping, a timed-out hand-off reported, inputs validated."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_step_tolerances import BOUNDS

from dsv41.amd.mono.checks import parity
from dsv41.amd.mono.launcher import MonoError, MonoRunner, mono_step, runner_for
from dsv41.amd.mono.plan import CTL_ERROR, Plan
from dsv41.common.kv_cache import PagedKVCache
from dsv41.common.scenario import make_scenario

MONO_Y_REL = BOUNDS["mono"]["y"]["rel_l2"]  # what mono achieves on CPU (measured: y equal)
# E8M0 codes of xo and z: all equal the reference's in every step here (measured on CPU)


@pytest.mark.slow
def test_consecutive_steps_across_epoch_wraparound(tiny_layer, run_mono, run_reference) -> None:
    """Two steps on one scratch, never cleared; the int32 epoch wraps between them."""
    lw = tiny_layer(4, 1)
    runner = MonoRunner(lw, 3, epoch=2**31 - 1)
    for step, seed in enumerate((1, 2)):
        sc = make_scenario(lw.dims, 1, 3, seed=seed)  # fresh x, positions, caches each step
        got = parity(lw.dims, run_mono(runner, sc.clone_caches()), run_reference(lw, sc))
        assert got["y_rel"] <= MONO_Y_REL, got
        assert got["xo_codes"] == got["z_codes"] == 1.0, got
        tag = [2**31 - 1, -(2**31)][step]  # the epoch this step ran under, now every tag
        for name in runner.plan.mailboxes:
            boxes = runner.views[name]
            assert boxes[:, 1].eq(tag).all() and boxes[:, 0].eq(0).all(), name
    assert runner.epoch == -(2**31) + 1


def test_timeout_raises_and_recovers(tiny_layer, run_mono, run_reference) -> None:
    """A mailbox that never fills makes its consumers time out: an error, never a hang; the
    runner resets its scratch and the next step is right."""
    lw = tiny_layer(4, 0)
    sc = make_scenario(lw.dims, 0, 2, seed=3)
    runner = MonoRunner(lw, 2, epoch=9)
    runner.views["xrdy"][1, 0] = -5  # "every wqkv task" now never reaches its count
    with pytest.raises(MonoError, match=r"norm task \(0,\) \(ticket \d+\) timed out"):
        run_mono(runner, sc)
    assert int(runner.views["ctl"][CTL_ERROR]) == 0
    assert runner.views["xrdy"][:, 0].eq(0).all()
    got = parity(lw.dims, run_mono(runner, sc.clone_caches()), run_reference(lw, sc))
    assert got["y_rel"] <= MONO_Y_REL, got
    assert got["xo_codes"] == got["z_codes"] == 1.0, got


def test_mono_step_validates(tiny_layer) -> None:
    lw = tiny_layer(2, 1)
    sc = make_scenario(lw.dims, 1, 2, seed=4)
    bad_table = sc.key_table.clone()
    bad_table[1, 0] = sc.window_cache.num_slots + 3
    with pytest.raises(MonoError, match=r"key_table\[1, 0\]: window slot \d+ is outside"):
        mono_step(lw, dataclasses.replace(sc, key_table=bad_table), validate=True)
    bad_slots = sc.slot_mapping.clone()
    bad_slots[0] = -2
    with pytest.raises(MonoError, match=r"slot_mapping: expected slots in \[0, \d+\) or -1"):
        mono_step(lw, dataclasses.replace(sc, slot_mapping=bad_slots), validate=True)
    mx_cache = PagedKVCache(2, sc.window_cache.block, "fp8_mx")
    with pytest.raises(MonoError, match="window_cache: expected record format fp8_ds_mla, got"):
        mono_step(lw, dataclasses.replace(sc, window_cache=mx_cache), validate=True)
    x49 = torch.zeros(49, lw.dims.model.hidden, dtype=torch.bfloat16)
    with pytest.raises(MonoError, match=r"x: expected 1 <= M <= 48 tokens, got 49"):
        mono_step(lw, dataclasses.replace(sc, x=x49), validate=True)
    with pytest.raises(ValueError, match=r"tokens: expected 1 <= tokens <= 48"):
        Plan(lw.dims, 49)


@pytest.mark.slow
def test_layers_and_token_counts_share_one_scratch(tiny_layer, run_reference) -> None:
    """mono_step's runners of one geometry share a scratch: layers and token counts alternate
    on it, never cleared, and each step is right."""
    steps = [(tiny_layer(4, 0), 3), (tiny_layer(4, 2), 2)]
    assert runner_for(*steps[0]).scratch is runner_for(*steps[1]).scratch
    for (lw, tokens), seed in zip(steps, (7, 8), strict=True):
        sc = make_scenario(lw.dims, lw.layer_id, tokens, seed=seed)
        work = sc.clone_caches()
        seams = mono_step(lw, work, validate=True)
        got = parity(lw.dims, seams, run_reference(lw, sc))
        assert got["y_rel"] <= MONO_Y_REL, got
        assert got["xo_codes"] == got["z_codes"] == 1.0, got
