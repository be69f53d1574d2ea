"""Compile a Triton kernel for SM90 on a machine without a GPU, for the tests that check what
the compiler emits from the kernel source (ptxas checks the PTX).

Triton reads ``TRITON_INTERPRET`` when it is imported, so the compile runs in a fresh Python
without it: ``ptx_facts(script, *args)`` runs ``script`` there (this folder on its path) and
returns the JSON object its last line prints; the script calls ``sm90_ptx``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def sm90_ptx(fn, consts: dict, kinds: dict, divisible=None, **options) -> str:
    """PTX of the jit function ``fn`` for SM90 with ``consts`` as its constexprs (the others
    their defaults). Every other argument is of type ``kinds[name]``, else ``*u8`` (a name
    ending in ``_ptr``) or ``i32``; those ``divisible(name, type)`` picks (by default the
    pointers) are 16-B divisible."""
    from dsv41.nvidia.sm90_compile import compile_sm90

    divisible = divisible or (lambda name, kind: kind[0] == "*")
    defaults = {p.name: p.default for p in fn.params if p.is_constexpr and p.has_default}
    consts = {**defaults, **consts}  # a constexpr left out takes its default, as a launch would
    sig = {n: "constexpr" if n in consts else kinds.get(n, "*u8" if n.endswith("_ptr") else "i32")
           for n in fn.arg_names}  # fmt: skip
    attrs = {n: [["tt.divisibility", 16]] for n in fn.arg_names if divisible(n, sig[n])}
    return compile_sm90(fn, sig, consts, attrs, **options).asm["ptx"]


def ptx_facts(script: str, *args: str) -> dict:
    """Run ``script`` (Python source) with ``args`` outside the interpreter; its last line of
    output as JSON."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH")) if p)
    run = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True,
                         text=True, cwd=ROOT, timeout=300, check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])
