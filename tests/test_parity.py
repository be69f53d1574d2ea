"""The parity job: seams compared pair by pair; a perturbed backend fails and is named."""

import dataclasses
import json

import pytest
import torch

from dsv41 import backends, cli
from dsv41.common.geometry import Dims
from dsv41.common.reference import reference_step
from dsv41.common.scenario import make_scenario
from dsv41.common.weights import LayerWeights
from dsv41.parity import compare, run_parity


def _reference(layer, inputs):
    return vars(reference_step(layer, inputs))


def _perturbed(seam, scale):
    """The reference with one seam multiplied by (1 + scale) after the fact."""

    def step(layer, inputs):
        seams = _reference(layer, inputs)
        seams[seam] = (seams[seam].float() * (1 + scale)).to(seams[seam].dtype)
        return seams

    return step


@pytest.fixture(scope="module")
def setup():
    dims = Dims.of("tiny", 2)
    lw = LayerWeights(dims, 1, 1)
    lw.dummy_load(3)
    return lw, make_scenario(dims, 1, 3, seed=5)


def test_identical_backends_agree_exactly(setup):
    lw, sc = setup
    results = run_parity(lw, sc, {"reference": _reference, "again": _reference})
    assert {c.seam for c in results} == {"x8", "qkv", "q", "xo", "z", "y", "y nan"}
    for c in results:
        assert c.ok and c.max_abs == 0 and c.rel_l2 == 0
        assert c.code_agreement in (None, 1.0)


def test_a_perturbed_seam_fails_and_only_it(setup):
    lw, sc = setup
    results = run_parity(lw, sc, {"reference": _reference, "bad": _perturbed("y", 0.05)})
    failed = {c.seam for c in results if not c.ok}
    assert failed == {"y"}
    bad = next(c for c in results if c.seam == "y")
    assert bad.pair == ("bad", "reference") and 0.03 < bad.rel_l2 < 0.07


def test_a_backend_answering_nan_input_otherwise_fails_y_nan(setup):
    """Bad values are part of parity: a backend whose y for a NaN in x differs from the
    reference's (a zero row) fails the ``y nan`` seam, and only it."""
    lw, sc = setup

    def nan_as_ones(layer, inputs):
        seams = _reference(layer, inputs)
        bad = ~torch.isfinite(inputs.x).all(dim=1)
        seams["y"] = torch.where(bad[:, None], 1.0, seams["y"].float()).to(torch.bfloat16)
        return seams

    results = run_parity(lw, sc, {"reference": _reference, "other": nan_as_ones})
    assert {c.seam for c in results if not c.ok} == {"y nan"}


def test_code_disagreement_fails_an_mx_seam():
    values = torch.randn(4, 64)
    codes = torch.randint(100, 130, (4, 2), dtype=torch.uint8)
    other = codes.clone()
    other[0, 0] += 1
    c = compare("xo", ("a", "b"), (values, other), (values, codes), 1e-2, 0.999)
    assert not c.ok and c.code_agreement == pytest.approx(7 / 8)


def test_nan_never_passes():
    a = torch.randn(16)
    b = a.clone()
    a[3] = float("nan")
    assert not compare("y", ("a", "b"), a, b, 1.0, 0.0).ok


def test_cli_exits_nonzero_and_names_the_seam(monkeypatch, tmp_path, capsys):
    real = backends.get

    def get(name):
        if name == "nvidia":
            return dataclasses.replace(real(name), step=_perturbed("qkv", 0.1))
        return real(name)

    monkeypatch.setattr(backends, "get", get)
    monkeypatch.setattr(backends, "available", lambda *args: ["nvidia"])
    out = tmp_path / "parity.json"
    rc = cli.main(["parity", "--config", "tiny", "--tp", "2", "--tokens", "2", "--json", str(out)])
    assert rc == 1
    assert "FAILED on seams: qkv" in capsys.readouterr().err
    report = json.loads(out.read_text())
    assert [c["seam"] for c in report["comparisons"] if not c["ok"]] == ["qkv"]
    assert report["verdict"] == "failed" and report["failed_seams"] == ["qkv"]


def test_the_main_job_is_green_on_cpu_for_every_backend(capsys):
    """`dsv41 parity` with no arguments: tiny geometry, tp 2, nvidia and mono in the interpreter."""
    assert cli.main(["parity"]) == 0
    out = capsys.readouterr().out
    for pair in ("nvidia vs reference", "mono vs reference", "mono vs nvidia"):
        assert pair in out
    assert "FAIL" not in out and "parity ok: 19 comparisons" in out  # 16 seams, 3 of "y nan"
    assert out.count("y nan ") == 3
