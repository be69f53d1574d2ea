"""The server path: mono_forward returns y with no host sync; a timeout surfaces at a later call."""

from __future__ import annotations

import pytest
import torch
from test_step_tolerances import BOUNDS

from dsv41.amd.mono.launcher import MonoError, mono_forward, runner_for
from dsv41.common.scenario import make_scenario

MONO_Y_REL = BOUNDS["mono"]["y"]["rel_l2"]  # what mono achieves on CPU (measured: y equal)


@pytest.mark.slow
def test_forward_equals_the_step_and_reports_a_timeout_one_call_later(tiny_layer, run_reference):
    lw = tiny_layer(2, 1)
    sc = make_scenario(lw.dims, 1, 3, seed=21)
    ref = run_reference(lw, sc)
    y = mono_forward(lw, sc.clone_caches())
    assert ((y.float() - ref.y.float()).norm() / ref.y.float().norm()).item() <= MONO_Y_REL

    runner = runner_for(lw, 3)
    runner.views["xrdy"][1, 0] = -5  # "every wqkv task" never reaches its count: norm times out
    mono_forward(lw, sc.clone_caches())  # returns; the error is on its way
    with pytest.raises(MonoError, match=r"norm task \(0,\) \(ticket \d+\) timed out"):
        mono_forward(lw, sc.clone_caches())
    y = mono_forward(lw, sc.clone_caches())  # scratch was reset: right again
    assert torch.isfinite(y.float()).all()
    assert ((y.float() - ref.y.float()).norm() / ref.y.float().norm()).item() <= MONO_Y_REL
