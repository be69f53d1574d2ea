"""Bad command lines end in argparse's error form: exit 2 and a message naming the argument (or the
file), what was expected and what came; no traceback, no run done first (issue 37, 2 / 3 / 10)."""

import os
import re
import stat

import pytest

from dsv41 import cli


def run(argv, capsys):
    """(exit code, stdout, stderr) of ``dsv41 argv``, argparse's exits included."""
    try:
        rc = cli.main(argv)
    except SystemExit as e:
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out, out.err


BAD_ARGS = [
    (["parity", "--tokens", "0"], "argument --tokens: expected an integer >= 1, got 0"),
    (["reference", "--tokens", "0"], "argument --tokens: expected an integer >= 1, got 0"),
    (["parity", "--tokens", "-1"], "argument --tokens: expected an integer >= 1, got -1"),
    (["plan", "--tokens", "-1"], "argument --tokens: expected an integer >= 1, got -1"),
    (["plan", "--tokens", "two"], "argument --tokens: expected an integer >= 1, got 'two'"),
    (["plan", "--tp", "3"], "argument --tp: invalid choice: 3"),
    (["reference", "--tp", "2", "--rank", "2"], "argument --rank: expected 0 <= rank < --tp = 2, got 2"),
    (["reference", "--layer", "-1"], "argument --layer: expected an integer >= 0, got -1"),
    (["parity", "--rel-tol", "-1"], "argument --rel-tol: expected a number > 0, got -1"),
    (["parity", "--rel-tol", "0"], "argument --rel-tol: expected a number > 0, got 0"),
    (["parity", "--rel-tol", "nan"], "argument --rel-tol: expected a number > 0, got nan"),
    (["parity", "--code-agreement", "1.5"], "argument --code-agreement: expected a number >= 0 and <= 1"),
    (["parity", "--backends", ""], "argument --backends: expected distinct comma-separated names"),
    (["parity", "--backends", "nvidia,"], "argument --backends: expected distinct comma-separated names"),
    (["parity", "--backends", "cutlass"], "from nvidia, mono, reference, got 'cutlass'"),
    (["parity", "--backends", "reference"], "argument --backends: expected kernel backends"),
    (["parity", "--seed", "-3"], "argument --seed: expected an integer >= 0, got -3"),
    (["parity", "--checkpoint", "/no/such/ckpt"], "argument --checkpoint: expected an existing directory"),
    (["checkpoint", "inspect", "/no/such/ckpt"], "argument dir: expected an existing directory"),
    (["checkpoint", "synth", "--out", "/tmp/x", "--shards", "0"], "argument --shards: expected an integer >= 1"),
    (["checkpoint", "synth", "--out", "/tmp/x", "--mtp", "-1"], "argument --mtp: expected an integer >= 0"),
    (["bench", "--replays", "0"], "argument --replays: expected an integer >= 1, got 0"),
    (["bench", "--tokens", "0,4"], "argument --tokens: expected token counts >= 1"),
    (["bench", "--tp", "4", "--rank", "4"], "argument --rank: expected 0 <= rank < --tp = 4, got 4"),
    (["bench", "--backend", ""], "argument --backend: expected names from"),
]


@pytest.mark.parametrize("argv, message", BAD_ARGS, ids=[" ".join(a) for a, _ in BAD_ARGS])
def test_bad_argument_is_refused_at_parse_time(argv, message, capsys):
    rc, out, err = run(argv, capsys)
    assert rc == 2 and message in err and "Traceback" not in err, err
    assert not out  # refused before any work


def test_json_into_a_missing_directory_is_refused_before_the_run(tmp_path, capsys):
    path = tmp_path / "no" / "such" / "x.json"
    rc, out, err = run(["parity", "--json", str(path)], capsys)
    assert rc == 2 and f"argument --json: expected a path in an existing directory, got {path}" in err
    assert "parity" not in out  # no comparison ran
    rc, _, err = run(["parity", "--json", str(tmp_path)], capsys)
    assert rc == 2 and "argument --json: expected a file path, got a directory" in err


@pytest.fixture
def checkpoint(tmp_path, capsys):
    out = tmp_path / "ckpt"
    assert cli.main(["checkpoint", "synth", "--config", "tiny", "--layers", "2", "--shards", "2",
                     "--out", str(out)]) == 0  # fmt: skip
    capsys.readouterr()
    return out


def test_truncated_shard_is_named_by_inspect_and_parity(checkpoint, capsys):
    shards = sorted(checkpoint.glob("*.safetensors"))
    for shard in shards:  # cut inside the tensor data: the header still parses
        os.truncate(shard, shard.stat().st_size - 1000)
    rc, _, err = run(["checkpoint", "inspect", str(checkpoint)], capsys)
    assert rc == 2 and "Traceback" not in err
    assert re.search(rf"{re.escape(str(shards[0]))}: expected a readable safetensors file, got: .+", err), err
    rc, out, err = run(["parity", "--checkpoint", str(checkpoint), "--tokens", "1", "--backends", "nvidia"],
                       capsys)  # fmt: skip
    assert rc == 2 and "Traceback" not in err and "parity ok" not in out
    assert re.search(r"/ckpt/model-0000[12]-of-00002\.safetensors: expected a readable safetensors", err), err
    os.truncate(shards[0], 5)  # the header itself cut
    rc, _, err = run(["checkpoint", "inspect", str(checkpoint)], capsys)
    assert rc == 2 and f"{shards[0]}: expected a readable safetensors file" in err


def test_synth_refuses_a_file_and_an_existing_checkpoint_without_force(checkpoint, tmp_path, capsys):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("keep me")
    rc, _, err = run(["checkpoint", "synth", "--out", str(a_file)], capsys)
    assert rc == 2 and f"argument --out: expected a directory, got an existing file: {a_file}" in err
    assert a_file.read_text() == "keep me"
    before = {p.name: p.read_bytes() for p in checkpoint.iterdir()}
    rc, _, err = run(["checkpoint", "synth", "--out", str(checkpoint), "--seed", "1"], capsys)
    assert rc == 2 and f"argument --out: {checkpoint} already holds a checkpoint" in err and "--force" in err
    assert {p.name: p.read_bytes() for p in checkpoint.iterdir()} == before  # untouched
    rc, _, _ = run(["checkpoint", "synth", "--out", str(checkpoint), "--seed", "1", "--shards", "1", "--force"],
                   capsys)  # fmt: skip
    assert rc == 0
    assert sorted(p.name for p in checkpoint.glob("*.safetensors")) == ["model-00001-of-00001.safetensors"]
    assert run(["checkpoint", "inspect", str(checkpoint)], capsys)[0] == 0


def test_synth_writes_shards_readable_by_all(checkpoint):
    shards = sorted(checkpoint.glob("*.safetensors"))
    assert len(shards) == 2
    assert {stat.S_IMODE(p.stat().st_mode) for p in shards} == {0o644}


def test_bench_help_names_its_command_and_every_help_shows_defaults(capsys):
    rc, out, _ = run(["bench", "--help"], capsys)
    assert rc == 0 and out.startswith("usage: dsv41 bench")
    flat = " ".join(out.split())
    assert "graph replays timed (default: 50)" in flat and "(default: 1,2,4,8,16,32,48)" in flat
    assert "(default: None)" not in flat
    rc, out, _ = run(["parity", "--help"], capsys)
    assert rc == 0 and out.startswith("usage: dsv41 parity")
    flat = " ".join(out.split())
    for default in ("--tp {1,2,4,8} tensor-parallel size (default: 2)", "(default: 4)", "(default: fp8_ds_mla)"):
        assert default in flat, flat


def test_plan_prints_units(capsys):
    rc, out, _ = run(["plan", "--config", "dsv41-flash", "--tp", "4", "--tokens", "2"], capsys)
    rows = {line[:12].strip(): line[12:].strip() for line in out.splitlines()}
    assert rc == 0
    assert rows["tokens"] == "2 tokens a step (M)" and rows["heads"] == "16 query heads a rank"
    assert rows["group_k"].startswith("4096 inputs of one wo_a group")
    assert rows["keys"] == "640 keys a token at most (topk + window)"


def test_reference_prints_no_norm_of_scale_codes(capsys):
    rc, out, _ = run(["reference", "--config", "tiny", "--tp", "2", "--tokens", "2"], capsys)
    assert rc == 0
    codes = [line for line in out.splitlines() if line.split()[:1] and line.split()[0].endswith(".codes")]
    assert codes
    for line in codes:  # the norm column is '-', then the codes' range
        assert re.search(r"uint8 .* - +codes \d+\.\.\d+$", line), line
    values = [line for line in out.splitlines() if line.startswith("y ")]
    assert re.search(r"\d+\.\d{4}$", values[0])  # float seams keep their norm
