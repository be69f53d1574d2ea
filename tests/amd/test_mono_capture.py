"""Mono's server path inside a caller's CUDA / HIP graph, its capture logic checked on the CPU
with the capture query mocked: while capturing, forward records the launch alone (no event, no
read of the error word); a timeout posted by a replay surfaces at a later call outside a
capture. And forward refuses a record format mono does not read, at the call (issue 37, 5 + 9)."""

from __future__ import annotations

import pytest
import torch

from dsv41.amd.mono import launcher
from dsv41.amd.mono.launcher import MonoError, mono_forward, runner_for
from dsv41.amd.mono.plan import CTL_ERROR
from dsv41.common.scenario import make_scenario
from dsv41.layer import CacheMetadata, DSV41Attention


def _fake_launch(inputs, y):
    y.copy_(inputs.x * 2)  # stands for the kernel: the logic around it is what is checked


def test_forward_inside_a_capture_records_only_the_launch(tiny_layer, monkeypatch):
    lw = tiny_layer(2, 1)
    sc = make_scenario(lw.dims, 1, 2, seed=31)
    runner = runner_for(lw, 2)
    calls = []
    monkeypatch.setattr(runner, "launch", _fake_launch)
    for name in ("raise_reported", "report_async", "check"):
        monkeypatch.setattr(runner, name, lambda name=name: calls.append(name))
    monkeypatch.setattr(launcher, "capturing", lambda device: True)
    y = mono_forward(lw, sc)
    assert torch.equal(y, sc.x * 2)
    assert calls == []  # no event query, no copy of the error word, no sync
    monkeypatch.setattr(launcher, "capturing", lambda device: False)
    mono_forward(lw, sc)
    assert calls == ["raise_reported", "report_async"]


def test_a_timeout_in_a_replay_surfaces_outside_the_capture(tiny_layer, monkeypatch):
    lw = tiny_layer(2, 1)
    sc = make_scenario(lw.dims, 1, 3, seed=32)
    runner = runner_for(lw, 3)
    monkeypatch.setattr(runner, "launch", _fake_launch)
    monkeypatch.setattr(launcher, "capturing", lambda device: True)
    mono_forward(lw, sc)  # captured
    runner.views["ctl"][CTL_ERROR] = 1  # a replay timed out: ticket 0 posted its error
    mono_forward(lw, sc)  # still capturing: nothing read
    monkeypatch.setattr(launcher, "capturing", lambda device: False)
    mono_forward(lw, sc)  # outside: the word's copy starts after this launch
    with pytest.raises(MonoError, match=r"\(ticket 0\) timed out .* scratch reset"):
        mono_forward(lw, sc)
    assert int(runner.views["ctl"][CTL_ERROR]) == 0
    mono_forward(lw, sc)  # reset: no error left


@pytest.mark.parametrize("which", ["window_cache", "compressed_cache"])
def test_forward_refuses_fp8_mx_caches_at_the_call(which, monkeypatch):
    monkeypatch.delenv("DSV41_BACKEND", raising=False)
    layer = DSV41Attention("tiny", 2, 0, 1, backend="mono")
    layer.weights.dummy_load(5)
    ds = make_scenario(layer.dims, 1, 2, seed=33)
    mx = make_scenario(layer.dims, 1, 2, seed=33, fmt="fp8_mx")
    caches = {"window_cache": ds.window_cache, "compressed_cache": ds.compressed_cache}
    caches[which] = getattr(mx, which)
    meta = CacheMetadata(ds.slot_mapping, ds.key_table, **caches)
    with pytest.raises(ValueError, match=f"{which}: backend mono expects record format "
                                         f"fp8_ds_mla, got fp8_mx"):
        layer(ds.x, ds.positions, meta)
