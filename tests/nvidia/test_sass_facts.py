"""benchmarks/sass_facts.py: one step's launches caught on CPU and compiled for SM90."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
STEP_KERNELS = ["mx_gemm_kernel", "norm_rope_insert_kernel", "mx_gemm_kernel",
                "mega_attention_kernel", "mega_attention_combine_kernel", "mx_gemm_kernel",
                "mx_gemm_kernel"]  # fmt: skip


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU tests compile for the real device")
def test_one_token_step_compiles_for_sm90(tmp_path):
    """tp 4, M = 1: the step's seven launches in order (Wqkv, the side stream's norm, wq_b,
    attention, combine, wo_a, wo_b), each with its PDL wait (one token: PDL on) and instructions
    after it, no spills, its PTX and SASS written with ``--dump``; and the tool refuses the
    interpreter."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "facts.json"
    run = subprocess.run([sys.executable, "benchmarks/sass_facts.py", "--tp", "4", "--tokens",
                          "1", "--json", str(out), "--dump", str(tmp_path / "asm")], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=600,
                         check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    rows = json.loads(out.read_text())
    assert [r["kernel"] for r in rows] == STEP_KERNELS
    for i, name in enumerate(STEP_KERNELS):  # --dump: each launch's PTX and SASS, its wait in both
        assert "griddepcontrol.wait" in (tmp_path / "asm" / f"{i}_{name}.ptx").read_text()
        assert "ACQBULK" in (tmp_path / "asm" / f"{i}_{name}.sass").read_text()
    for r in rows:
        assert r["after_wait"] and 0 < r["after_wait"] < r["sass"], r
        assert 0 < r["registers"] <= 255 and r["spilled_bytes"] == 0, r
    assert "mega_attention_kernel" in run.stdout
    env["TRITON_INTERPRET"] = "1"
    refused = subprocess.run([sys.executable, "benchmarks/sass_facts.py"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert refused.returncode != 0 and "unset TRITON_INTERPRET" in refused.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU tests compile for the real device")
def test_mono_launch_compiles_for_sm90(tmp_path):
    """``--backend mono``, tp 4, M = 1: mono's one launch, 8 warps, registers within a thread's
    255 and no PDL wait; its code is past 64 KB (offsets of five hex digits), and every
    instruction is counted: the count is the last instruction's offset / 16 + 1."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "facts.json"
    run = subprocess.run([sys.executable, "benchmarks/sass_facts.py", "--backend", "mono",
                          "--tp", "4", "--tokens", "1", "--json", str(out), "--dump",
                          str(tmp_path / "asm")], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600, check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    (row,) = json.loads(out.read_text())
    assert row["kernel"] == "mono_kernel" and row["warps"] == 8, row
    assert 0 < row["registers"] <= 255 and row["after_wait"] is None, row
    sass = (tmp_path / "asm" / "0_mono_kernel.sass").read_text()
    offsets = [int(o, 16) for o in re.findall(r"/\*([0-9a-f]{4,})\*/", sass)]
    assert offsets[-1] >= 0x10000 and row["sass"] == offsets[-1] // 16 + 1, (row, offsets[-1])
