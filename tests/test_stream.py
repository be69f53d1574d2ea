"""benchmarks/stream.py's CPU-visible parts: argument errors, the no-GPU refusal, the one-launch
streaming reference's sums (interpreter), the launch filter, the stage names and bytes of a real
nvidia step (interpreter), the table."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from dsv41.bench import step_function
from dsv41.common.geometry import Dims
from dsv41.common.scenario import make_scenario
from dsv41.common.weights import LayerWeights
from dsv41.nvidia.tuning import tuning_for


@pytest.fixture(scope="module")
def stream():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "stream.py"
    spec = importlib.util.spec_from_file_location("stream", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["stream"] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules["stream"]


@pytest.mark.parametrize("argv, says", [
    (["--backend", "cutlass"], "--backend: invalid choice"),
    (["--tokens", "1,x"], "--tokens: expected comma-separated ints"),
    (["--tokens", "0"], "--tokens: expected token counts >= 1"),
    (["--tp", "4", "--rank", "4"], "--rank: expected 0 <= rank < --tp = 4"),
    (["--backend", "mono", "--tp", "8"], "mono cannot run tp 8"),
    (["--backend", "mono", "--tokens", "1,64"], "expected max_tokens <= 48"),
    (["--json", "/no/such/dir/out.json"], "--json"),
    (["--variant", "no_such_field=1"], "--variant: expected a field of nvidia's Tuning"),
])  # fmt: skip
def test_bad_arguments_are_named(stream, capsys, argv, says):
    with pytest.raises(SystemExit) as e:
        stream.parse_args(argv)
    assert e.value.code == 2 and says in capsys.readouterr().err


def test_arguments_parsed(stream):
    args = stream.parse_args(["--backend", "mono", "--tp", "2", "--tokens", "1,48"])
    assert (args.backend, args.tp, args.tokens) == ("mono", 2, [1, 48])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_refuses_without_a_gpu(stream, capsys):
    assert stream.main(["--tokens", "1"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_reference_reads_every_weight_and_code_byte(stream):
    """The one-launch reference's row sums add up to the sum of a layer's projection bytes and
    codes, so it reads each once (the padding is zeros)."""
    layer = LayerWeights(Dims.of("tiny", 2), 0, 1)
    layer.dummy_load(seed=4)
    w, codes = stream.stream_buffers(layer)
    names = ("wqkv", "wq_b", "wo_a", "wo_b")
    expected = sum(getattr(layer, n).view(torch.uint8).long().sum().item()
                   + getattr(layer, n + "_scale").long().sum().item() for n in names)  # fmt: skip
    assert w.numel() % (stream.CHUNK_ROWS * stream.CHUNK_COLS) == 0
    assert codes.numel() * 32 == w.numel()
    out = torch.zeros(3, stream.CHUNK_ROWS, dtype=torch.int32)
    stream.stream(w, codes, out, programs=3, stages=3, warps=4)
    assert out.long().sum().item() == expected


def test_launch_filter_runs_only_the_kept_launches(stream):
    class Kernel:
        def __init__(self):
            self.grids, self.warmed = [], 0

        def __getitem__(self, grid):
            return lambda *args, **kwargs: self.grids.append(grid)

        def warmup(self, *args, **kwargs):
            self.warmed += 1

    kernel = Kernel()
    launches = stream.StepLaunches(step=None)
    wrapped = stream._Launch(kernel, "gemm", launches)
    launches.keep = {1, 3}
    for grid in range(4):
        wrapped[(grid,)](0, x=1)
    wrapped.warmup(0)
    assert kernel.grids == [(1,), (3,)] and kernel.warmed == 1
    assert launches.seen == ["gemm"] * 4 and launches.stages == ["wqkv", "wq_b", "wo_a", "wo_b"]


def test_stages_and_bytes_of_an_nvidia_step(stream):
    """One nvidia step under the interpreter: its launches by stage, in order, and what each
    must move; the kernels are the real ones again afterwards."""
    from dsv41.nvidia.ops import mx_gemm

    dims = Dims.of("tiny", 2)
    layer = LayerWeights(dims, 0, 1)
    layer.dummy_load(seed=1)
    sc = make_scenario(dims, 1, 1, seed=2)
    real = mx_gemm.mx_gemm_kernel
    with stream.StepLaunches(step_function("nvidia")) as launches:
        launches(layer, sc)
        stages = launches.stages
    assert mx_gemm.mx_gemm_kernel is real
    assert stages == ["wqkv", "norm", "wq_b", "attention", "combine", "wo_a", "wo_b"]
    m = dims.model
    assert stream.stage_bytes("wq_b", layer, sc, 0) == dims.q_rows * m.q_rank * 33 // 32
    assert stream.stage_bytes("wo_a", layer, sc, 0) == dims.o_rows * dims.group_k * 33 // 32
    entries = int((sc.key_table != -1).sum())  # the scenario's entries all lie inside the caches
    assert stream.stage_bytes("attention", layer, sc, 0) == entries * 584
    assert stream.stage_bytes("combine", layer, sc, 123) == 123
    assert stream.stage_bytes("norm", layer, sc, 0) is None
    splits = tuning_for(dims, torch.device("cpu"), 1).attention.splits
    assert stream.partials_bytes(dims, 1, torch.device("cpu"), {}) == (
        0 if splits == 1 else dims.heads * splits * 514 * 4)
    one = {"attention.splits": 1, "attention.keys_per_split": m.keys}
    assert splits > 1 and stream.partials_bytes(dims, 1, torch.device("cpu"), one) == 0


def test_stages_of_a_variant(stream):
    """``--variant attention.key_block=16`` at an MMA bucket: the changed field parsed, x's
    rounding a stage of its own and the GEMMs keeping their sites' names."""
    args = stream.parse_args(["--variant", "attention.key_block=16", "--tokens", "5"])
    assert args.changes == {"attention.key_block": 16}
    dims = Dims.of("tiny", 2)
    layer = LayerWeights(dims, 0, 1)
    layer.dummy_load(seed=1)
    sc = make_scenario(dims, 1, 5, seed=2)
    with stream.StepLaunches(step_function("nvidia", args.changes)) as launches:
        launches(layer, sc)
        stages = launches.stages
    assert stages == ["x_round", "wqkv", "norm", "wq_b", "attention", "wo_a", "wo_b"]
    assert stream.stage_bytes("x_round", layer, sc, 0) is None


def test_mono_stages_from_made_up_traces(stream):
    """mono's rows: each stage under the nvidia stage's name, its time the median over the
    traces of (its last end - the stage before's last end), its bytes and TB/s."""
    from dsv41.amd.mono.plan import Plan

    dims = Dims.of("tiny", 4)
    layer = LayerWeights(dims, 0, 1)
    sc = make_scenario(dims, 1, 3, seed=2)
    plan = Plan(dims, 3)
    gaps = ([2.0, 3.0, 5.0], [1.0, 4.0, 4.5])  # us from ready to a stage's end, by trace
    traces = []
    for k in range(3):  # stage s ends (s + 1) * 10 us + a gap of its own, every task at once
        t = torch.zeros(plan.total_tasks, 3, dtype=torch.int64)
        end = 0.0
        for s, st in enumerate(plan.stages):
            start, end = end, end + 10.0 + gaps[s % 2][k]
            t[st.first : st.end, 0] = int(start * 1e3)
            t[st.first : st.end, 1] = int(end * 1e3)
        traces.append(t)
    rows = stream.mono_stage_rows(plan, traces, layer, sc)
    assert [r["stage"] for r in rows] == [stream.MONO_NAMES[st.name] for st in plan.stages]
    assert [r["stage"] for r in rows] == ["x cast", "wqkv", "norm", "wq_b", "attention",
                                          "combine", "wo_a", "wo_b"]  # fmt: skip
    for s, r in enumerate(rows):
        assert r["us"] == pytest.approx(10.0 + sorted(gaps[s % 2])[1])
    wq_b = rows[3]
    assert wq_b["bytes"] == dims.q_rows * dims.model.q_rank * 33 // 32
    assert wq_b["tb_s"] == pytest.approx(wq_b["bytes"] / (wq_b["us"] * 1e-6) / 1e12)
    partials = 3 * plan.chunks * plan.heads_padded * 514 * 4
    assert rows[5]["bytes"] == partials and rows[2]["bytes"] is None


def test_table_shows_each_stage_and_the_step(stream):
    per_m = {"tokens": 1, "floor_us": 9.5, "step": {"us": 24.0, "bytes": 40e6, "tb_s": 1.67,
                                                    "x_floor": 24.0 / 9.5},
             "stages": [{"stage": "wqkv", "us": 5.0, "bytes": 9.46e6, "tb_s": 1.89,
                         "cublas_us": 11.0, "x_cublas": 5.0 / 11.0},
                        {"stage": "norm", "us": 1.5, "bytes": None, "tb_s": None},
                        {"stage": "wo_b", "error": "RuntimeError: no", "bytes": 5e6,
                         "cublas_error": "RuntimeError: shape"}]}  # fmt: skip
    lines = stream.format_table(per_m).splitlines()
    assert lines[1] == "M = 1"
    assert lines[4].split() == ["wqkv", "5.00", "9.46", "1.89", "11.00", "0.45"]
    assert lines[5].split() == ["norm", "1.50", "-", "-", "-", "-"]
    assert lines[6].split() == ["wo_b", "-", "5.00", "-", "-", "-"]
    assert lines[7].split() == ["ours:", "RuntimeError:", "no"]
    assert lines[8].split() == ["cuBLAS:", "RuntimeError:", "shape"]
    assert lines[9].startswith("step") and "2.53 x the floor, 9.50 us" in lines[9]


def test_a_failing_figure_is_a_row_with_its_error(stream, capsys):
    def fails():
        raise RuntimeError("cuBLAS refuses\nmore")

    why = stream.attempt("M = 1 cuBLAS wqkv", fails)
    assert why == "RuntimeError: cuBLAS refuses"
    assert "M = 1 cuBLAS wqkv: RuntimeError: cuBLAS refuses" in capsys.readouterr().err
    assert stream.figure(why, 100) == {"error": why, "bytes": 100}
    assert stream.figure(2e-6, 4_000_000, warps=4) == {"us": 2.0, "bytes": 4_000_000,
                                                       "tb_s": 2.0, "warps": 4}
    assert stream.attempt("ok", lambda: 1.5) == 1.5
