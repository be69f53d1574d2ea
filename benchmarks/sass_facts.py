"""What each kernel of the nvidia step (or mono's one launch) compiles to on SM90, without a GPU.

One step of M tokens at a tp share runs on CPU tensors of the real geometry with every Triton
launch caught instead of run (``JITFunction.run``), the launchers seeing an H200: 132 SMs, a
CUDA device for the step's choices, and so the GPU's constexprs (not the interpreter's). Each
caught launch is then compiled for SM90 (Triton's own ptxas) and described: registers a thread,
spilled bytes, shared memory, SASS instructions, and those after the PDL wait (``ACQBULK``):
what a program issues once its inputs are ready, the part of a one-token step that is on its
critical path (docs/history.md). Pointer arguments count as 16-B aligned, as
torch allocates them; an int argument divisible by 16 as such, and one equal to 1 as the
constexpr 1, as Triton specializes them (unless the kernel says not to). The
installed Triton compiles (the H200 runs 3.6: put one first on the path to match it).

    python benchmarks/sass_facts.py --tp 4 --tokens 1 [--backend mono] [--dump DIR]

``--backend mono`` catches mono's persistent launch instead (one program a SM, the GPU's
constexprs: tensor-core dots, the PTX e4m3 conversion): its registers a thread bound the warps
a SM holds (65,536 registers a SM). It has no PDL wait, so no count after one.

``--dump DIR`` also writes each launch's TTGIR, PTX and SASS there (``<n>_<kernel>.ttgir`` /
``.ptx`` / ``.sass``, n its place in the step), to read what follows a wait and which layouts
Triton chose.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import torch

H200_SMS = 132
_PTR = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16",
        torch.int32: "*i32", torch.int64: "*i64", torch.uint8: "*u8", torch.int8: "*i8",
        torch.float8_e4m3fn: "*fp8e4nv"}  # fmt: skip


@contextlib.contextmanager
def caught_launches(calls: list):
    """Every ``JITFunction.run`` appends ``(fn, args, kwargs)`` to ``calls`` and returns."""
    from triton.runtime.jit import JITFunction

    run = JITFunction.run

    def catch(self, *args, grid, warmup, **kwargs):
        calls.append((self, args, kwargs))

    JITFunction.run = catch
    try:
        yield
    finally:
        JITFunction.run = run


@contextlib.contextmanager
def seen_as_h200(layer):
    """The launchers' SM count 132, and attention told what a GPU step of ``layer`` tells it
    (the step's one device-dependent choice past the SM count)."""
    import dsv41.nvidia.ops.mega_attention as attention
    import dsv41.nvidia.ops.mx_gemm as gemm
    from dsv41.nvidia import step

    saved = (gemm.sm_count, attention.sm_count, step.sm_count, step.mega_attention,
             attention.launch_alone)  # fmt: skip
    cuda = torch.device("cuda")

    def launch(kernel, grid, alone, device, *args, **kwargs):  # holding a SM alone changes
        kernel[grid](*args, **kwargs)  # the launch's shared memory only, not what it compiles to

    def attend(*args, records_ready, **kwargs):  # on a GPU the norm kernel's side stream
        m = args[0].shape[0]  # joins attention by an event where wq_b normalises qr itself
        kwargs["records_ready"] = step.norm_in_wq_b(layer, m, cuda)
        return saved[3](*args, **kwargs)

    gemm.sm_count = attention.sm_count = step.sm_count = lambda device: H200_SMS
    step.mega_attention = attend
    attention.launch_alone = launch
    try:
        yield
    finally:
        (gemm.sm_count, attention.sm_count, step.sm_count, step.mega_attention,
         attention.launch_alone) = saved  # fmt: skip


def signature(fn, args: tuple, kwargs: dict) -> tuple[dict, dict, dict, dict]:
    """``(signature, constexprs, attrs, options)`` of a caught launch, by argument name, as
    ``compile_sm90`` takes them."""
    names = fn.arg_names
    bound = dict(zip(names, args)) | {k: v for k, v in kwargs.items() if k in names}
    options = {k: v for k, v in kwargs.items() if k not in names}
    options.pop("launch_pdl", None)  # a launch attribute, not a compile option
    consts = {p.name: bound.get(p.name, p.default) for p in fn.params if p.is_constexpr}
    sig, attrs = {}, {}
    skip = {fn.arg_names[i] if isinstance(i, int) else i for i in fn.do_not_specialize}
    for i, name in enumerate(names):
        value = bound.get(name, fn.params[i].default)
        if name in consts:
            sig[name] = "constexpr"
        elif isinstance(value, torch.Tensor):
            sig[name] = _PTR[value.dtype]
            attrs[name] = [["tt.divisibility", 16]]
        elif value is None:
            sig[name], consts[name] = "constexpr", None
        elif isinstance(value, float):
            sig[name] = "fp32"
        elif name not in skip and int(value) == 1:  # Triton specializes a 1 as a constexpr
            sig[name], consts[name] = "constexpr", 1
        else:
            sig[name] = "i32" if -(2**31) <= int(value) < 2**31 else "i64"
            if name not in skip and int(value) % 16 == 0:
                attrs[name] = [["tt.divisibility", 16]]
    return sig, consts, attrs, options


def facts(fn, args: tuple, kwargs: dict, dump: Path | None = None) -> dict:
    """One caught launch compiled for SM90: its resource use and SASS counts; with ``dump`` (a
    path without suffix) its PTX and SASS written to ``dump.ptx`` and ``dump.sass``."""
    import triton

    from dsv41.nvidia.sm90_compile import compile_sm90

    sig, consts, attrs, options = signature(fn, args, kwargs)
    kernel = compile_sm90(fn, sig, consts, attrs, **options)
    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        sass = subprocess.run([tools / "cuobjdump", "-sass", cubin], capture_output=True,
                              text=True, check=True).stdout  # fmt: skip
        usage = subprocess.run([tools / "cuobjdump", "-res-usage", cubin], capture_output=True,
                               text=True, check=True).stdout  # fmt: skip
    if dump is not None:
        dump.with_suffix(".ptx").write_text(kernel.asm["ptx"])
        dump.with_suffix(".ttgir").write_text(kernel.asm["ttgir"])
        dump.with_suffix(".sass").write_text(sass)
    lines = re.findall(r"^\s+/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", sass, flags=re.MULTILINE)
    wait = next((i for i, line in enumerate(lines) if "ACQBULK" in line), None)
    after = lines[wait:] if wait is not None else []
    ops = Counter(re.sub(r"^@!?U?P\w+\s+", "", line).split(" ")[0].split(".")[0]
                  for line in after)  # fmt: skip
    use = dict(re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", usage))
    return {
        "kernel": fn.__name__,
        "warps": options.get("num_warps", 4),
        "registers": int(use.get("REG", 0)),
        "spilled_bytes": int(use.get("STACK", 0)) + int(use.get("LOCAL", 0)),
        "shared_bytes": kernel.metadata.shared,
        "sass": len(lines),
        "after_wait": len(after) if wait is not None else None,
        "top_after_wait": ops.most_common(6),
    }


def _layer_and_step(tp: int, tokens: int, fmt: str, layer_id: int) -> tuple:
    """Rank 0's dummy-loaded weights of dsv41-flash's layer ``layer_id`` at ``tp`` and a step of
    ``tokens`` tokens with records in ``fmt``: ``(layer, scenario)``."""
    from dsv41.common.geometry import Dims
    from dsv41.common.scenario import make_scenario
    from dsv41.common.weights import LayerWeights

    dims = Dims.of("dsv41-flash", tp)
    layer = LayerWeights(dims, rank=0, layer_id=layer_id)
    layer.dummy_load(seed=0)
    return layer, make_scenario(dims, layer_id, tokens, fmt=fmt)


def step_launches(tp: int, tokens: int, fmt: str, layer_id: int = 1) -> list:
    """The caught launches of one nvidia step: ``(fn, args, kwargs)`` in launch order."""
    from dsv41.nvidia.step import nvidia_step

    layer, sc = _layer_and_step(tp, tokens, fmt, layer_id)
    calls: list = []
    with seen_as_h200(layer), caught_launches(calls):
        nvidia_step(layer, sc)
    return calls


def mono_launches(tp: int, tokens: int, layer_id: int = 1) -> list:
    """The caught launch of one mono step: ``[(fn, args, kwargs)]``, a program a SM of an H200
    (mono's records are fp8_ds_mla)."""
    from dsv41.amd.mono.launcher import MonoRunner

    layer, sc = _layer_and_step(tp, tokens, "fp8_ds_mla", layer_id)
    calls: list = []
    with caught_launches(calls):
        MonoRunner(layer, tokens, programs=H200_SMS).launch(sc, torch.empty_like(sc.x))
    return calls


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tp", type=int, default=4, choices=(2, 4))
    p.add_argument("--tokens", type=int, default=1)
    p.add_argument("--fmt", default="fp8_ds_mla", choices=("fp8_ds_mla", "fp8_mx"),
                   help="record format (SM90 stores fp8_ds_mla)")
    p.add_argument("--backend", default="nvidia", choices=("nvidia", "mono"))
    p.add_argument("--layer", type=int, default=1,
                   help="the model's layer (default 1, uncompressed; the bench's graphs hold "
                        "the compressed layers, the first of them 2)")
    p.add_argument("--json", help="write the rows to this file too")
    p.add_argument("--dump", type=Path,
                   help="write each launch's TTGIR, PTX and SASS to this folder")  # fmt: skip
    a = p.parse_args(argv)
    if a.backend == "mono" and a.fmt != "fp8_ds_mla":
        p.error(f"--fmt: mono stores fp8_ds_mla records only, got {a.fmt}")
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("sass_facts: unset TRITON_INTERPRET (the launchers must pick the GPU's "
                 "constexprs)")  # fmt: skip
    import triton

    if a.dump:
        a.dump.mkdir(parents=True, exist_ok=True)
    from dsv41.common.platform import parse_target, targeting

    with targeting(parse_target("sm90")):  # the launchers choose PDL and PTX for an H200
        if a.backend == "mono":
            launches = mono_launches(a.tp, a.tokens, a.layer)
        else:
            launches = step_launches(a.tp, a.tokens, a.fmt, a.layer)
    rows = [facts(*call, dump=a.dump / f"{i}_{call[0].__name__}" if a.dump else None)
            for i, call in enumerate(launches)]  # fmt: skip
    print(f"{a.backend}, layer {a.layer}, tp {a.tp}, M = {a.tokens}, {a.fmt}, SM90, Triton "
          f"{triton.__version__}: each launch of one step")
    print(f"{'kernel':32} {'warps':>5} {'regs':>4} {'spill':>5} {'shared':>6} {'sass':>5} "
          f"{'after wait':>10}  most after the wait")  # fmt: skip
    for r in rows:
        top = ", ".join(f"{op} {n}" for op, n in r["top_after_wait"])
        print(f"{r['kernel']:32} {r['warps']:5} {r['registers']:4} {r['spilled_bytes']:5} "
              f"{r['shared_bytes']:6} {r['sass']:5} {r['after_wait']!s:>10}  {top}")  # fmt: skip
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
