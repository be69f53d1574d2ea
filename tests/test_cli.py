"""The dsv41 command line: plan, reference, checkpoint synth / inspect."""

from safetensors.torch import load_file, save_file

from dsv41 import cli


def test_plan_prints_the_rank_geometry(capsys):
    assert cli.main(["plan", "--config", "dsv41-flash", "--tp", "4", "--tokens", "1"]) == 0
    out = capsys.readouterr().out
    for line in ("heads       16", "group_k     4096", "rank 3      heads 48..63, groups 6..7"):
        assert line in out


def test_plan_prints_mono_stages_and_task_counts(capsys):
    """dsv41-flash, tp 4: 512 wq_b tasks of 16 rows, 64 wo_a row blocks in 4 K parts (256
    tasks), 320 wo_b tasks of 16 rows; the tuning the plan was built from."""
    assert cli.main(["plan", "--config", "dsv41-flash", "--tp", "4", "--tokens", "1",
                     "--backend", "mono"]) == 0  # fmt: skip
    out = {line.split("  ")[0].strip(): line for line in capsys.readouterr().out.splitlines()}
    assert "512 tasks" in out["stage wqb"] and "256 tasks" in out["stage woa"]
    assert "320 tasks" in out["stage wob"] and "woa_parts" in out and "num_warps" in out


def test_plan_prints_the_nvidia_tuning(capsys):
    assert cli.main(["plan", "--config", "dsv41-flash", "--tp", "4", "--tokens", "1",
                     "--backend", "nvidia"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "norm_in_wq_b    True" in out and "z_cast_in_wo_b  True" in out
    assert "wqkv            cuda-core" in out and "attention       splits" in out


def test_plan_refuses_a_tp_that_splits_a_group(capsys):
    assert cli.main(["plan", "--config", "tiny", "--tp", "8"]) == 2
    assert "tp: 8 does not divide model 'tiny'" in capsys.readouterr().err


def test_reference_prints_every_seam(capsys):
    assert cli.main(["reference", "--config", "tiny", "--tp", "2", "--tokens", "3"]) == 0
    out = capsys.readouterr().out
    for seam in ("x8.values", "qkv", "qr", "kv", "q ", "lse", "o ", "xo.codes", "z ", "y "):
        assert "\n" + seam in out
    assert "[3, 16, 512]" in out


def test_checkpoint_synth_then_inspect_and_a_corrupted_file(tmp_path, capsys):
    out = tmp_path / "ckpt"
    assert cli.main(["checkpoint", "synth", "--config", "tiny", "--layers", "2", "--out", str(out)]) == 0
    assert cli.main(["checkpoint", "inspect", str(out)]) == 0
    assert "26 tensors, all valid" in capsys.readouterr().out
    shard = min(out.glob("*.safetensors"))
    tensors = load_file(shard)
    name = min(tensors)
    tensors[name] = tensors[name].float()
    save_file(tensors, shard)
    assert cli.main(["checkpoint", "inspect", str(out)]) == 2
    assert f"{name}: expected" in capsys.readouterr().err
