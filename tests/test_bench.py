"""The benchmark's CPU-visible parts: argument checks, the table, the plot, the no-GPU refusal."""

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from dsv41 import bench, cli


def _rows():
    common = {"config": "dsv41-flash", "tp": 4, "rank": 0, "layers": 4}
    rows = []
    for m, us in ((1, 20.0), (16, 30.0)):
        floor = 9.5 + m * 0.1
        rows.append({**common, "backend": "nvidia", "tokens": m, "us_per_step": us, "floor_us": floor,
                     "ratio_to_floor": us / floor, "reference_us": 7000.0,
                     "speedup_vs_reference": 7000.0 / us})
    rows.append({**common, "backend": "mono", "tokens": 64, "error": "ValueError: S: expected <= 48"})
    return rows


def test_table_has_each_row_and_its_ratios():
    table = bench.format_table(_rows())
    assert "nvidia        1      20.0       9.6     2.08    7000.0     350.0" in table
    assert "mono         64  ValueError: S: expected <= 48" in table


def test_bad_backend_is_refused_by_name():
    with pytest.raises(SystemExit):
        bench.parse_args(["--backend", "cutlass"])
    assert bench.parse_args(["--backend", "nvidia,mono"]).backends == ["nvidia", "mono"]


def test_plot_writes_a_png_or_says_why_not(tmp_path):
    path = tmp_path / "bench.png"
    note = bench.plot(_rows(), str(path))
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib is not installed" in note and not path.exists()
    else:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_cli_bench_refuses_without_a_gpu(capsys):
    assert cli.main(["bench", "--backend", "nvidia"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_compressed_layer_is_the_first_layer_with_both_caches():
    dims, layer = bench.compressed_layer("tiny", 2, seed=3, device="cpu")
    ratios = dims.model.compress_ratios
    assert ratios[layer.layer_id] and not any(ratios[: layer.layer_id])
    assert layer.rank == 1 and layer.wqkv.float().abs().sum() > 0  # last rank, loaded


def test_variants_parse_to_their_fields_types():
    args = bench.parse_args(["--backend", "nvidia,mono",
                             "--variant", "nvidia:wo_a.block_k=128, pdl=0",
                             "--variant", "mono:mma_split=None,gemv_cores=true,woa_parts=2"])
    assert args.variants == [
        bench.Variant("nvidia", {"wo_a.block_k": 128, "pdl": False}, "wo_a.block_k=128,pdl=0"),
        bench.Variant("mono", {"mma_split": None, "gemv_cores": True, "woa_parts": 2},
                      "mma_split=None,gemv_cores=true,woa_parts=2"),
    ]
    assert bench.parse_args(["--backend", "mono"]).variants == []


@pytest.mark.parametrize("spec, backend, says", [
    ("torch:pdl=1", "nvidia,torch", "with BACKEND in ('nvidia', 'mono'), got 'torch:pdl=1'"),
    ("nvidia", "nvidia", "expected BACKEND:FIELD=VALUE[,FIELD=VALUE...]"),
    ("nvidia:pdl", "nvidia", "expected FIELD=VALUE after nvidia:, got 'pdl'"),
    ("nvidia:wo_a=1", "nvidia", "attention.{splits, keys_per_split, qk_split"),
    ("nvidia:wo_a.block_z=1", "nvidia", "{wqkv, wq_b, wo_a, wo_b}.{block_m, block_n, block_k"),
    ("mono:gemv_tile=1", "mono", "(gemv_block, gemv_cores, gemv_words, gemv_pairs, mma_split"),
    ("nvidia:pdl=yes", "nvidia", "nvidia pdl: expected 0, 1, true or false, got 'yes'"),
    ("nvidia:attention.splits=4.5", "nvidia", "attention.splits: expected an int, got '4.5'"),
    ("mono:mma_split=auto", "mono", "mono mma_split: expected an int or None, got 'auto'"),
    ("nvidia:pdl=1,pdl=0", "nvidia", "expected each field once, got 'pdl' twice"),
    ("mono:num_warps=4", "nvidia", "expected a backend of --backend (nvidia) to compare with, "
                                   "got 'mono'"),
])  # fmt: skip
def test_bad_variants_are_refused_saying_what_was_expected(capsys, spec, backend, says):
    with pytest.raises(SystemExit):
        bench.parse_args(["--backend", backend, "--variant", spec])
    err = capsys.readouterr().err
    assert "argument --variant: " in err and says in err


def _nvidia_default(tokens: int = 16):
    from dsv41.common.geometry import Dims
    from dsv41.nvidia.tuning import resolve

    return resolve(Dims.of("dsv41-flash", 4), 132, tokens)


def test_nvidia_dotted_change_replaces_that_field_alone():
    from dsv41.nvidia.tuning import changed

    t = _nvidia_default()
    assert t.wo_a.block_k != 128 and t.attention.splits != 3  # the changes change something
    new = changed(t, {"wo_a.block_k": 128, "attention.splits": 3, "pdl": not t.pdl})
    assert new.wo_a == dataclasses.replace(t.wo_a, block_k=128)
    assert new.attention == dataclasses.replace(t.attention, splits=3)
    assert new == dataclasses.replace(t, wo_a=new.wo_a, attention=new.attention, pdl=not t.pdl)
    with pytest.raises(ValueError, match="AttentionTuning.qk_split"):  # run() makes it an error row
        changed(t, {"attention.qk_split": 3})


def test_nvidia_variant_launches_with_the_changed_tuning(monkeypatch):
    from dsv41.nvidia import step, tuning

    seen = {}

    def fake_step(layer, inputs, *, check, tuning):
        seen.update(check=check, tuning=tuning)
        return {"y": "y"}

    monkeypatch.setattr(tuning, "tuning_for", lambda dims, device, tokens: _nvidia_default(tokens))
    monkeypatch.setattr(step, "nvidia_step", fake_step)
    launch = bench.step_function("nvidia", {"wo_b.num_stages": 3})
    layer, inputs = SimpleNamespace(dims=None), SimpleNamespace(x=torch.zeros(16, 4), tokens=16)
    assert launch(layer, inputs) == "y"
    want = _nvidia_default(16)
    assert seen == {"check": False, "tuning": dataclasses.replace(
        want, wo_b=dataclasses.replace(want.wo_b, num_stages=3))}
    assert want.wo_b.num_stages != 3


def test_mono_variant_resolves_its_changes_in_runners_of_its_own(monkeypatch):
    from dsv41.amd.mono import launcher
    from dsv41.amd.mono.tuning import resolve

    dims, layer = bench.compressed_layer("tiny", 2, seed=3, device="cpu")
    seen = []
    monkeypatch.setattr(launcher, "mono_launch", lambda lw, inputs, tuning: seen.append(tuning))
    changes = {"gemv_cores": False, "mma_split": 4}
    bench.step_function("mono", changes)(layer, SimpleNamespace(tokens=3))
    assert seen == [resolve(dims, 3, **changes)] and seen[0] != resolve(dims, 3)
    with pytest.raises(ValueError, match="mono Tuning.num_warps"):  # an error row in run()
        bench.step_function("mono", {"num_warps": 3})(layer, SimpleNamespace(tokens=3))

    monkeypatch.undo()
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # runners of a CPU layer, built, never launched
    same = resolve(dims, 3)  # even the default's choices get a runner of their own
    assert launcher.runner_for(layer, 3, same) is not launcher.runner_for(layer, 3)
    assert launcher.runner_for(layer, 3, seen[0]).plan.tuning == seen[0]
    assert launcher.runner_for(layer, 3, seen[0]) is launcher.runner_for(layer, 3, seen[0])


def test_variant_rows_are_labelled_and_compared_with_the_default():
    rows = _rows()[:2]
    rows.append({**rows[0], "variant": "wo_a.block_k=128", "y_vs_default": 0.0})
    rows.append({**rows[1], "variant": "wo_a.block_k=128", "y_vs_default": 0.0078125})
    rows.append({**rows[1], "variant": "attention.qk_split=3",
                 "error": "ValueError: AttentionTuning.qk_split: expected 1, 2, 4 or 8"})
    lines = bench.format_table(rows).splitlines()
    w = len("nvidia[attention.qk_split=3]")  # the backend column fits the longest label
    assert lines[0].startswith(f"{'backend':<{w}}    M") and lines[0].endswith(" y vs def")
    assert lines[2].startswith(f"{'nvidia':<{w}}    1      20.0")
    assert lines[4] == (f"{'nvidia[wo_a.block_k=128]':<{w}}    1      20.0       9.6     2.08    "
                        "7000.0     350.0" + " " * 18 + "0")  # no x torch; bit-equal
    assert lines[5].endswith("233.3" + " " * 12 + "0.00781")
    assert lines[6] == ("nvidia[attention.qk_split=3]   16  ValueError: AttentionTuning.qk_split: "
                        "expected 1, 2, 4 or 8")
    assert bench.label(rows[2]) == "nvidia[wo_a.block_k=128]" and bench.label(rows[0]) == "nvidia"
    assert "y vs def" not in bench.format_table(_rows())
