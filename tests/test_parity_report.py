"""``dsv41 parity`` says which backends it skipped and why (their limits from the registry), and
its JSON carries the verdict and every input that made it (issue 37, 7 and 10)."""

import dataclasses
import json

import pytest

from dsv41 import backends, cli

MONO_LIMITS = "mono's limits: tp in (2, 4), at most 48 tokens, record formats fp8_ds_mla"


@pytest.fixture
def nvidia_is_the_reference(monkeypatch):
    """nvidia's step replaced by the reference's, so a run costs two reference steps (the
    skipping and the report are under test here, not the kernels)."""
    real = backends.get
    monkeypatch.setattr(backends, "get", lambda name: dataclasses.replace(
        real("reference"), name=name) if name == "nvidia" else real(name))  # fmt: skip


def parity(argv, capsys):
    rc = cli.main(["parity", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("argv, why", [
    (["--tp", "2", "--tokens", "49"], "expected max_tokens <= 48 (its scratch holds that many), got 49"),
    (["--tp", "1", "--tokens", "2"], "expected tp in (2, 4) (its task tables are laid out for them), got tp 1"),
    (["--tp", "2", "--tokens", "2", "--record-format", "fp8_mx"],
     "expected a record format in ('fp8_ds_mla',), got 'fp8_mx'"),
])  # fmt: skip
def test_parity_says_why_it_skipped_mono(argv, why, nvidia_is_the_reference, capsys):
    rc, out, err = parity(["--config", "tiny", *argv], capsys)
    assert rc == 0, err
    assert f"skipped mono: {why} ({MONO_LIMITS})" in out
    assert "nvidia vs reference" in out and "mono vs" not in out


def test_parity_names_a_backend_left_out_by_backends(nvidia_is_the_reference, capsys):
    rc, out, _ = parity(["--tp", "2", "--tokens", "2", "--backends", "nvidia"], capsys)
    assert rc == 0 and "skipped mono: not in --backends" in out


@pytest.mark.parametrize("config, tp", [("tiny", "1"), ("dsv41-flash", "8")])
def test_parity_backends_mono_out_of_its_limits_says_them(config, tp, capsys):
    rc, out, err = parity(["--config", config, "--tp", tp, "--backends", "mono"], capsys)
    assert rc == 2 and not out  # refused before any weight is made
    assert (f"--backends: mono cannot run at tp {tp} with 4 tokens in fp8_ds_mla: expected tp in "
            f"(2, 4) (its task tables are laid out for them), got tp {tp}; {MONO_LIMITS}") in err


def test_parity_json_has_the_verdict_and_every_input(nvidia_is_the_reference, tmp_path, capsys):
    ckpt, report = tmp_path / "ckpt", tmp_path / "parity.json"
    assert cli.main(["checkpoint", "synth", "--config", "tiny", "--layers", "3", "--shards", "1",
                     "--out", str(ckpt)]) == 0  # fmt: skip
    rc, out, err = parity(["--checkpoint", str(ckpt), "--tp", "2", "--rank", "1", "--layer", "2",
                           "--tokens", "49", "--seed", "3", "--json", str(report)], capsys)  # fmt: skip
    assert rc == 0, err
    got = json.loads(report.read_text())
    inputs = {"config": "tiny", "tp": 2, "rank": 1, "layer": 2, "tokens": 49,
              "record_format": "fp8_ds_mla", "seed": 3, "checkpoint": str(ckpt), "deploy": None}  # fmt: skip
    assert {k: got[k] for k in inputs} == inputs
    assert got["verdict"] == "ok" and got["failed_seams"] == []
    assert got["compared"] == ["reference", "nvidia"]
    assert got["skipped"] == {"mono": f"expected max_tokens <= 48 (its scratch holds that many), "
                                      f"got 49 ({MONO_LIMITS})"}  # fmt: skip
    assert len(got["comparisons"]) == int(out.split("parity ok: ")[1].split()[0]) > 0
    assert all(c["ok"] for c in got["comparisons"])
