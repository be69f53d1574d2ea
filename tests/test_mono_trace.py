"""benchmarks/mono_trace.py's stage table on a made-up trace (no GPU): spans, readiness, load."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from dsv41.amd.mono.plan import Plan
from dsv41.common.geometry import Dims
from dsv41.common.weights import LayerWeights


def _mono_trace():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "mono_trace.py"
    spec = importlib.util.spec_from_file_location("mono_trace", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_stage_table_from_a_made_up_trace() -> None:
    dims = Dims.of("tiny", 4)
    plan, layer = Plan(dims, 3), LayerWeights(dims, 0, 1)
    trace = torch.zeros(plan.total_tasks, 3, dtype=torch.int64)
    for k, st in enumerate(plan.stages):  # stage k: task j runs 10 us * k + (0 .. 4 us + 10 j ns)
        j = torch.arange(st.tasks)
        trace[st.first : st.end, 0] = 10_000 * k
        trace[st.first : st.end, 1] = 10_000 * k + 4_000 + 10 * j
        trace[st.first : st.end, 2] = j % 2
    rows = _mono_trace().stage_table(plan, trace, layer)
    assert [r["stage"] for r in rows] == [st.name for st in plan.stages if st.tasks]
    last = 0.0
    for k, (r, st) in enumerate(zip(rows, plan.stages)):
        end = 10.0 * k + 4.0 + 0.01 * (st.tasks - 1)
        assert r["first_us"] == pytest.approx(10.0 * k) and r["last_us"] == pytest.approx(end)
        assert r["ready_us"] == pytest.approx(last) and r["after_us"] == pytest.approx(end - last)
        assert r["work_us"] == pytest.approx(4.0 + 0.005 * (st.tasks - 1))  # starts after ready
        assert r["per_program"] == (st.tasks + 1) // 2
        last = end
    wqb = next(r for r in rows if r["stage"] == "wqb")
    assert wqb["weight_mb"] == pytest.approx((layer.wq_b.numel() + layer.wq_b_scale.numel()) / 1e6)
