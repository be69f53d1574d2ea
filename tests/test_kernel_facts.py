"""benchmarks/kernel_facts.py: one step's launches caught on CPU and compiled for SM90, SM100,
gfx942 and gfx950, each variant compiled once a run (a subprocess without the interpreter)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
STEP_KERNELS = ["mx_gemm_kernel", "norm_rope_insert_kernel", "mx_gemm_kernel",
                "mega_attention_kernel", "mega_attention_combine_kernel", "mx_gemm_kernel",
                "mx_gemm_kernel"]  # fmt: skip
AMD = ("gfx942", "gfx950")


def step_kernels(tokens: int) -> list[str]:
    """The nvidia step's launches in order for ``tokens``: above the CUDA-core buckets x's
    dequantized copy (``mx_round``, the MMA loop's activation) comes first."""
    from dsv41.nvidia.ops.launch import bucket_for
    from dsv41.nvidia.ops.mx_gemm import GEMV

    return (["mx_round_kernel"] if bucket_for(tokens) > GEMV.max_m else []) + STEP_KERNELS

pytestmark = [pytest.mark.skipif(torch.cuda.is_available(),
                                 reason="the GPU tests compile for the real device"),
              pytest.mark.slow, pytest.mark.timeout(3600)]  # fmt: skip


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}


def launch_facts(variants: list[tuple]) -> dict[tuple, list[dict]]:
    """``kernel_facts.launch_facts(*v)`` for each ``v = (target, backend, tp, tokens, fmt)``,
    in one process without the interpreter (Triton reads it when imported)."""
    script = ("import json, sys; sys.path.insert(0, 'benchmarks'); import kernel_facts as kf; "
              "vs = json.loads(sys.argv[1]); "
              "print(json.dumps([kf.launch_facts(*v) for v in vs]))")  # fmt: skip
    run = subprocess.run([sys.executable, "-c", script, json.dumps(variants)], cwd=ROOT,
                         env=_env(), capture_output=True, text=True, timeout=3000,
                         check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return dict(zip(variants, json.loads(run.stdout.splitlines()[-1])))


def _amd_clean(rows: list[dict], what, spills: bool = True) -> None:
    """Every launch compiled, no NVIDIA-only construct in its IR, within a lane's 512 registers
    and at least one program a CU; with ``spills`` no VGPR spilled either."""
    for r in rows:
        assert "error" not in r, (what, r)
        assert r["nvidia_only"] == [] and r["programs_per_cu"] >= 1, (what, r)
        assert 0 < r["vgpr"] + r["agpr"] <= 512, (what, r)
        assert not spills or r["vgpr_spills"] == 0, (what, r)


@pytest.fixture(scope="module")
def amd_facts() -> dict:
    """The issue's variants for gfx942 and gfx950, each compiled once: mono at tp 2 and 4, M = 1
    and 48; the fallback (the nvidia-style path a ROCm node takes outside mono) at tp 8, M = 1,
    2 and 48."""
    variants = [(t, "mono", tp, m, "fp8_ds_mla") for t in AMD for tp in (2, 4) for m in (1, 48)]
    variants += [(t, "nvidia", 8, m, "fp8_ds_mla") for t in AMD for m in (1, 2, 48)]
    return launch_facts(variants)


@pytest.mark.parametrize("target", AMD)
def test_mono_compiles_for_amd(amd_facts, target):
    """Mono's one launch, 8 waves on ROCm (its Tuning), compiles for AMD with its byte-by-byte
    e4m3 conversion: no PTX left in it."""
    for (t, backend, tp, m, _), rows in amd_facts.items():
        if t == target and backend == "mono":
            assert [r["kernel"] for r in rows] == ["mono_kernel"] and rows[0]["warps"] == 8
            _amd_clean(rows, (t, tp, m), spills=False)


@pytest.mark.parametrize("target", AMD)
def test_mono_without_vgpr_spills_on_amd(amd_facts, target):
    """ROCm's Tuning (8 waves, 16-key slices, GEMV blocks of 128, tensor-core blocks in 8 K
    segments) spills no VGPR at tp 2 and 4, one and 48 tokens (docs/amd.md: every bucket)."""
    for (t, backend, tp, m, _), rows in amd_facts.items():
        if t == target and backend == "mono":
            assert rows[0]["vgpr_spills"] == 0, (t, tp, m, rows[0])


@pytest.mark.parametrize("target", AMD)
def test_the_fallback_compiles_for_amd_at_tp_8(amd_facts, target):
    """A ROCm node at tp 8 runs the nvidia-style Triton path: no PDL, no PTX (they did not
    compile for AMD), the step's launches in their order."""
    for (t, backend, tp, m, _), rows in amd_facts.items():
        if t == target and backend == "nvidia":
            assert [r["kernel"] for r in rows][:3] == step_kernels(m)[:3], (m, rows)
            _amd_clean(rows, (t, tp, m))


def test_every_nvidia_launch_compiles_for_sm100():
    """GB200 is never run here: tp 4, M = 1 and 48, fp8_mx, every launch compiles for SM100
    without a spilled byte; PDL waits at one token as on SM90."""
    facts = launch_facts([("sm100", "nvidia", 4, m, "fp8_mx") for m in (1, 48)])
    for (_, _, _, m, _), rows in facts.items():
        for r in rows:
            assert "error" not in r and r["spilled_bytes"] == 0, (m, r)
            assert 0 < r["registers"] <= 255 and r["programs_per_sm"] >= 1, (m, r)
            assert ("griddepcontrol" in r["nvidia_only"]) == (m == 1), (m, r)


def test_one_token_step_compiles_for_sm90(tmp_path):
    """tp 4, M = 1: the step's seven launches in order (Wqkv, the side stream's norm, wq_b,
    attention, combine, wo_a, wo_b), each with its PDL wait (one token: PDL on) and
    instructions after it, no spills, its PTX and SASS written with ``--dump``; and the tool
    refuses the interpreter."""
    out = tmp_path / "facts.json"
    run = subprocess.run([sys.executable, "benchmarks/kernel_facts.py", "--target", "sm90",
                          "--tp", "4", "--tokens", "1", "--json", str(out), "--dump",
                          str(tmp_path / "asm")], cwd=ROOT, env=_env(), capture_output=True,
                         text=True, timeout=900, check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    rows = json.loads(out.read_text())
    assert [r["kernel"] for r in rows] == STEP_KERNELS
    for i, name in enumerate(STEP_KERNELS):  # --dump: each launch's PTX and SASS, its wait in both
        if (tmp_path / "asm" / f"{i}_{name}.ptx").exists():  # a repeated launch is dumped once
            assert "griddepcontrol.wait" in (tmp_path / "asm" / f"{i}_{name}.ptx").read_text()
            assert "ACQBULK" in (tmp_path / "asm" / f"{i}_{name}.sass").read_text()
    for r in rows:
        assert r["after_wait"] and 0 < r["after_wait"] < r["sass"], r
        assert 0 < r["registers"] <= 255 and r["spilled_bytes"] == 0, r
    assert "mega_attention_kernel" in run.stdout and "prog/SM" in run.stdout
    env = _env() | {"TRITON_INTERPRET": "1"}
    refused = subprocess.run([sys.executable, "benchmarks/kernel_facts.py"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert refused.returncode != 0 and "unset TRITON_INTERPRET" in refused.stderr


def test_mono_launch_compiles_for_sm90(tmp_path):
    """``--backend mono``, tp 4, M = 1: mono's one launch, 8 warps, registers within a thread's
    255 and no PDL wait; its code is past 64 KB (offsets of five hex digits), and every
    instruction is counted: the count is the last instruction's offset / 16 + 1."""
    out = tmp_path / "facts.json"
    run = subprocess.run([sys.executable, "benchmarks/kernel_facts.py", "--backend", "mono",
                          "--tp", "4", "--tokens", "1", "--json", str(out), "--dump",
                          str(tmp_path / "asm")], cwd=ROOT, env=_env(), capture_output=True,
                         text=True, timeout=900, check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    (row,) = json.loads(out.read_text())
    assert row["kernel"] == "mono_kernel" and row["warps"] == 8, row
    assert 0 < row["registers"] <= 255 and row["after_wait"] is None, row
    sass = (tmp_path / "asm" / "0_mono_kernel.sass").read_text()
    offsets = [int(o, 16) for o in re.findall(r"/\*([0-9a-f]{4,})\*/", sass)]
    assert offsets[-1] >= 0x10000 and row["sass"] == offsets[-1] // 16 + 1, (row, offsets[-1])


def test_tuning_changes_reach_the_mono_compile(tmp_path):
    """``--tuning FIELD=VALUE`` replaces a field of the target's mono Tuning: gfx942, tp 4,
    M = 48 in whole tensor-core blocks (``mma_split=1``) spills VGPRs where ROCm's own 8 K
    segments spill none (docs/amd.md); a name that is no Tuning field is refused."""
    out = tmp_path / "facts.json"
    args = [sys.executable, "benchmarks/kernel_facts.py", "--target", "gfx942", "--backend",
            "mono", "--tp", "4", "--tokens", "48", "--json", str(out)]  # fmt: skip
    run = subprocess.run([*args, "--tuning", "mma_split=1"], cwd=ROOT, env=_env(),
                         capture_output=True, text=True, timeout=900, check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    (row,) = json.loads(out.read_text())
    assert row["warps"] == 8 and row["vgpr_spills"] > 0, row
    bad = subprocess.run([*args, "--tuning", "warps=8"], cwd=ROOT, env=_env(),
                         capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert bad.returncode != 0 and "--tuning: expected a field of mono's Tuning" in bad.stderr, (
        bad.stderr)


def test_tuning_changes_reach_the_nvidia_compile(tmp_path):
    """``--tuning`` with nvidia's dotted names: SM90, tp 4, M = 48, attention's 16-key dots
    with the keys as the A operand (one 16 KB key block in shared memory, 44 KB in all) capped
    at 168 registers: 3 programs a SM (the default's 32-key dots: 2; Triton 3.6 spills nothing
    there, 3.9 16 B); a value of the wrong type is refused."""
    out = tmp_path / "facts.json"
    args = [sys.executable, "benchmarks/kernel_facts.py", "--target", "sm90", "--tp", "4",
            "--tokens", "48", "--json", str(out)]  # fmt: skip
    change = ["--tuning", "attention.key_block=16", "--tuning", "attention.keys_a=1",
              "--tuning", "attention.max_registers=168"]  # fmt: skip
    run = subprocess.run([*args, *change], cwd=ROOT, env=_env(), capture_output=True,
                         text=True, timeout=900, check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    rows = json.loads(out.read_text())
    (attention,) = [r for r in rows if r["kernel"] == "mega_attention_kernel"]
    assert attention["registers"] == 168 and attention["shared_bytes"] < 48 * 1024, attention
    assert attention["programs_per_sm"] == 3, attention
    bad = subprocess.run([*args, "--tuning", "attention.key_block=wide"], cwd=ROOT, env=_env(),
                         capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert bad.returncode != 0 and "nvidia attention.key_block: expected an int" in bad.stderr, (
        bad.stderr)


def test_the_fallback_compiles_for_amd_at_every_tp_and_bucket():
    """The full sweep (about 15 minutes here): tp 1, 2, 4, 8, the decode and two prefill
    buckets in fp8_ds_mla, M = 1 and 48 in fp8_mx, gfx942 and gfx950: every launch compiles,
    no NVIDIA-only construct, no VGPR spill."""
    buckets = (1, 2, 4, 8, 16, 32, 48, 64, 128)
    variants = [(t, "nvidia", tp, m, fmt) for t in AMD for tp in (1, 2, 4, 8)
                for fmt in ("fp8_ds_mla", "fp8_mx") for m in buckets
                if fmt == "fp8_ds_mla" or m in (1, 48)]  # fmt: skip
    for v, rows in launch_facts(variants).items():
        assert [r["kernel"] for r in rows] == step_kernels(v[3]), (v, rows)
        _amd_clean(rows, v)
