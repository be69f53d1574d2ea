"""The benchmark's CPU-visible parts: argument checks, the table, the plot, the no-GPU refusal."""

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
