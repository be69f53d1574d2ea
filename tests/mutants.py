"""Mutation check: each named small bug, applied to a copy of the package, must fail a test.

    PYTHONPATH=$PWD python tests/mutants.py            # every mutant
    PYTHONPATH=$PWD python tests/mutants.py mono_y_rtz # some, by name

For each mutation the script copies ``dsv41/`` to a temporary directory, applies the one text
substitution (its ``old`` must occur exactly once), runs the tests named for it with the
copy first on the path (the tests themselves are the repository's) and prints caught or
missed with the time taken. Exit status 1 if any mutant survives.
``tests/test_mutants.py`` checks that every pattern still occurs exactly once.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class Mutation:
    name: str
    path: str  # inside the repository
    old: str
    new: str
    tests: tuple[str, ...]  # pytest arguments: node ids, files, -k expressions
    why: str


MUTATIONS = (
    Mutation(
        "e8m0_rounding", "dsv41/common/mx.py",
        "code = exp - 8 + (mant > _MANT_1_75).int()",
        "code = exp - 8 + (mant >= _MANT_1_75).int()",
        ("tests/common/test_mx.py",),
        "E8M0 code one too large for amax exactly 448 * 2^k",
    ),
    Mutation(
        "inverse_rope_forward", "dsv41/common/rope.py",
        "_broadcast(sin, positions, x, 0.0), -1.0, nope)",
        "_broadcast(sin, positions, x, 0.0), 1.0, nope)",
        ("tests/test_step_cases.py::test_reference_matches_float64_recomputation",),
        "the reference's inverse RoPE turns o forward again",
    ),
    Mutation(
        "q_permutation", "dsv41/common/fused_layout.py",
        "return (h * head_dim + c * Q_CHUNK + j).reshape(-1)",
        "return (h * head_dim + c * Q_CHUNK + j).transpose(0, 1).reshape(-1)",
        ("tests/common/test_fused_layout.py",),
        "fused Q head-major instead of chunk-major",
    ),
    Mutation(
        "key_table_window", "dsv41/common/kv_cache.py",
        "win_pos = positions.long()[:, None] - (window - 1) + torch.arange(window, device=device)",
        "win_pos = positions.long()[:, None] - window + torch.arange(window, device=device)",
        ("tests/common/test_kv_cache.py", "-k", "key_table"),
        "the window drops the token itself and takes one older key",
    ),
    Mutation(
        "mono_y_rtz", "dsv41/amd/mono/kernel.py",
        "bf16_round_tl(acc).to(tl.bfloat16), mask=(tok < S)[:, None])",
        "acc.to(tl.bfloat16), mask=(tok < S)[:, None])",
        ("tests/test_step_tolerances.py", "-k", "mono"),
        "mono's y cast truncates (the interpreter's cast) instead of rounding to nearest even",
    ),
    Mutation(
        "nvidia_y_rtz", "dsv41/nvidia/ops/mx_gemm.py",
        "out = bf16_rn_tl(acc, HW)",
        "out = acc",
        ("tests/test_step_tolerances.py", "-k", "nvidia"),
        "the GEMM epilogue (qkv, q, z, y) casts to bf16 by truncation on CPU",
    ),
    Mutation(
        "mono_attn_wait_dropped", "dsv41/amd/mono/kernel.py",
        "ok = _wait(qrdy_ptr, tag, spin_limit, ctl_ptr, t)  # records inserted",
        "ok = t >= 0  # records inserted",
        ("tests/amd/test_mono_handoffs.py", "-k", "kernel_waits"),
        "attention no longer waits for every token's record to be inserted",
    ),
    Mutation(
        "nvidia_a_deq_group_ignored", "dsv41/nvidia/ops/mx_gemm.py",
        "stride_am + (group * K + k)[None, :],",
        "stride_am + k[None, :],",
        ("tests/nvidia/test_step.py::test_step_matches_reference[fp8_ds_mla-5]",),
        "the MMA loop on dequantized activations reads every group's columns from group 0",
    ),
    Mutation(
        "nvidia_code_words_wrong_byte", "dsv41/common/mx.py",
        "return (words >> ((g % 4) * 8)[None, :]) & 0xFF",
        "return (words >> ((g // 4) * 8)[None, :]) & 0xFF",
        ("tests/nvidia/test_step.py", "-k", "codes_as_words"),
        "a weight code read as words takes its word's byte of another code",
    ),
    Mutation(
        "mono_a_deq_wrong_columns", "dsv41/amd/mono/kernel.py",
        "ad_ptr + tok[:, None] * a_stride + k0 + k[None, :],",
        "ad_ptr + tok[:, None] * a_stride + k[None, :],",
        ("tests/amd/test_mono_kernel.py", "-k", "dequantized_activations"),
        "the tensor-core GEMV on dequantized activations reads block 0's columns at every K step",
    ),
)


def apply(mutation: Mutation, package_root: Path) -> None:
    """Apply ``mutation`` to the copy under ``package_root`` (its ``old`` must occur once)."""
    path = package_root / mutation.path
    text = path.read_text()
    count = text.count(mutation.old)
    if count != 1:
        raise ValueError(f"{mutation.name}: expected its pattern once in {mutation.path}, "
                         f"found it {count} times")  # fmt: skip
    path.write_text(text.replace(mutation.old, mutation.new))


def run(mutation: Mutation) -> tuple[bool, float, str]:
    """(caught, seconds, the first failed test or else the tests' last line) of one mutant."""
    with tempfile.TemporaryDirectory(prefix=f"mutant-{mutation.name}-") as tmp:
        copy = Path(tmp)
        shutil.copytree(ROOT / "dsv41", copy / "dsv41",
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
        apply(mutation, copy)
        env = {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"}
        where = subprocess.run([sys.executable, "-c", "import dsv41; print(dsv41.__file__)"],
                               env=env, cwd=copy, capture_output=True, text=True)  # fmt: skip
        if not where.stdout.startswith(str(copy)):
            raise RuntimeError(f"{mutation.name}: dsv41 imports from {where.stdout.strip()!r}, "
                               f"not the copy in {copy}: {where.stderr[-500:]}")  # fmt: skip
        args = [str(ROOT / a) if a.startswith("tests/") else a for a in mutation.tests]
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
             "--rootdir", str(ROOT), *args],
            env=env, cwd=copy, capture_output=True, text=True,
        )  # fmt: skip
        seconds = time.perf_counter() - t0
        stdout = proc.stdout.replace(os.path.relpath(ROOT, copy) + os.sep, "")
    lines = [ln for ln in stdout.splitlines() if ln.startswith("FAILED")]
    lines = lines or [ln for ln in stdout.splitlines() if ln.strip()]
    # pytest exit 1: tests failed (caught); 5: none collected, anything else: an error
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"{mutation.name}: pytest exited {proc.returncode}:\n"
                           f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}")  # fmt: skip
    shown = (lines[0] if proc.returncode else lines[-1]) if lines else ""
    return proc.returncode == 1, seconds, shown


def main(names: list[str]) -> int:
    known = {m.name: m for m in MUTATIONS}
    for n in names:
        if n not in known:
            raise SystemExit(f"mutant: expected one of {', '.join(known)}, got {n!r}")
    chosen = [known[n] for n in names] if names else list(MUTATIONS)
    survivors, t0 = [], time.perf_counter()
    for m in chosen:
        caught, seconds, last = run(m)
        print(f"{'caught' if caught else 'MISSED':<7} {m.name:<24} {seconds:6.1f} s  {last}",
              flush=True)  # fmt: skip
        if not caught:
            survivors.append(m.name)
    print(f"{len(chosen) - len(survivors)}/{len(chosen)} caught in "
          f"{time.perf_counter() - t0:.0f} s" + (f"; survived: {survivors}" if survivors else ""))
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
