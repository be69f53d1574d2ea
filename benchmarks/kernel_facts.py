"""What each launch of one step compiles to on SM90, SM100, gfx942 or gfx950, without a GPU.

One step of M tokens at a tp share runs on CPU tensors of the real geometry with every Triton
launch caught instead of run (``JITFunction.run``), the launchers choosing for ``--target``
(``dsv41.common.platform.targeting``: PDL and inline PTX on NVIDIA only) and seeing its GPU's
multiprocessor count. Each distinct launch is then compiled for the target
(``triton.compile(ASTSource(...), target=GPUTarget(...))``) and described:

- NVIDIA: registers a thread, spilled bytes, shared memory, the programs a SM holds (65,536
  registers, 228 KB of shared memory, 64 warps), SASS instructions and those after the PDL
  wait (``ACQBULK``: what a program issues once its inputs are ready).
- AMD (CDNA3 / CDNA4, 64-lane waves): VGPRs + AGPRs a lane, VGPR and SGPR spills, LDS, the
  waves a SIMD holds (512 registers a lane shared by the waves of a SIMD, 8 waves at most)
  and the programs a CU holds (4 SIMDs, the LDS).

A launch that does not compile is a row with its error, never a crash. Pointer arguments count
as 16-B aligned, as torch allocates them; an int argument divisible by 16 as such, and one
equal to 1 as the constexpr 1, as Triton specializes them. The installed Triton compiles.

    python benchmarks/kernel_facts.py --target gfx942 [--backend nvidia|mono] --tp 4 \\
        --tokens 1 [--fmt fp8_ds_mla|fp8_mx] [--json FILE] [--dump DIR] [--tuning FIELD=VALUE]

``--tuning`` (repeatable) changes a field of the backend's Tuning as ``dsv41 bench --variant``
does: ``attention.keys_a=1`` (nvidia, dotted names) or ``num_warps=8`` (mono).

``--dump DIR`` writes each launch's TTGIR and its PTX + SASS (NVIDIA) or AMDGCN (AMD) there
(``<n>_<kernel>.<ext>``, n its place in the step).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import torch

# Multiprocessors of the GPU each target stands for: H200, B200, MI300X, MI355X.
MULTIPROCESSORS = {"sm90": 132, "sm100": 148, "gfx942": 304, "gfx950": 256}
SM_REGISTERS, SM_SHARED, SM_WARPS, SM_PROGRAMS = 65536, 233472, 64, 32  # SM90 / SM100
SIMD_REGISTERS, SIMD_WAVES, CU_SIMDS = 512, 8, 4  # CDNA3 / CDNA4: registers a lane of a SIMD
CU_LDS = {"gfx942": 65536, "gfx950": 163840}
# What only NVIDIA code contains, in the LLVM IR: PDL, the bulk prefetch, PTX cvt and timers.
NVIDIA_ONLY = ("griddepcontrol", "cp.async.bulk", "cvt.rn.f16x2.e4m3x2", "globaltimer", "%smid",
               "llvm.nvvm")  # fmt: skip
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
def seen_as_gpu(layer, target: str):
    """The launchers see ``target``'s multiprocessor count, and attention is told what a GPU
    step of ``layer`` tells it (the step's one device-dependent choice past that count)."""
    import dsv41.nvidia.ops.mega_attention as attention
    import dsv41.nvidia.ops.mx_gemm as gemm
    from dsv41.nvidia import step, tuning

    saved = (gemm.sm_count, attention.sm_count, tuning.sm_count, step.mega_attention,
             attention.launch_alone)  # fmt: skip
    gpu = torch.device("cuda")

    def launch(kernel, grid, alone, device, *args, **kwargs):  # holding a SM alone changes
        kernel[grid](*args, **kwargs)  # the launch's shared memory only, not what it compiles to

    def attend(*args, records_ready, **kwargs):  # on a GPU the norm kernel's side stream
        m = args[0].shape[0]  # joins attention by an event where wq_b normalises qr itself
        kwargs["records_ready"] = tuning.tuning_for(layer.dims, gpu, m).norm_in_wq_b
        return saved[3](*args, **kwargs)

    gemm.sm_count = attention.sm_count = tuning.sm_count = lambda device: MULTIPROCESSORS[target]
    step.mega_attention = attend
    attention.launch_alone = launch
    try:
        yield
    finally:
        (gemm.sm_count, attention.sm_count, tuning.sm_count, step.mega_attention,
         attention.launch_alone) = saved  # fmt: skip


def signature(fn, args: tuple, kwargs: dict) -> tuple[dict, dict, dict, dict]:
    """``(signature, constexprs, attrs, options)`` of a caught launch, by argument name."""
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


def _nvidia_facts(kernel, warps: int, dump: Path | None) -> dict:
    import triton

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
        dump.with_suffix(".sass").write_text(sass)
    lines = re.findall(r"^\s+/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", sass, flags=re.MULTILINE)
    wait = next((i for i, line in enumerate(lines) if "ACQBULK" in line), None)
    after = lines[wait:] if wait is not None else []
    ops = Counter(re.sub(r"^@!?U?P\w+\s+", "", line).split(" ")[0].split(".")[0]
                  for line in after)  # fmt: skip
    use = dict(re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", usage))
    regs, shared = int(use.get("REG", 0)), kernel.metadata.shared
    threads = warps * 32
    by_regs = SM_REGISTERS // (-(-regs * 32 // 256) * 256 * warps) if regs else SM_PROGRAMS
    return {
        "registers": regs,
        "spilled_bytes": int(use.get("STACK", 0)) + int(use.get("LOCAL", 0)),
        "shared_bytes": shared,
        "programs_per_sm": min(by_regs, SM_SHARED // max(shared, 1), SM_WARPS * 32 // threads,
                               SM_PROGRAMS),  # fmt: skip
        "sass": len(lines),
        "after_wait": len(after) if wait is not None else None,
        "top_after_wait": ops.most_common(6),
    }


def _amd_facts(kernel, warps: int, arch: str, dump: Path | None) -> dict:
    gcn = kernel.asm["amdgcn"]
    if dump is not None:
        dump.with_suffix(".amdgcn").write_text(gcn)

    def field(name: str) -> int:
        return max(int(v) for v in re.findall(rf"\.{name}:\s+(\d+)", gcn))

    # .vgpr_count is a lane's whole allocation: the VGPRs, 4-aligned, then the AGPRs
    total, agpr, lds = field("vgpr_count"), field("agpr_count"), kernel.metadata.shared
    waves = min(SIMD_WAVES, SIMD_REGISTERS // max(-(-total // 8) * 8, 1))  # granule of 8
    return {
        "vgpr": total - agpr,
        "agpr": agpr,
        "vgpr_spills": field("vgpr_spill_count"),
        "sgpr_spills": field("sgpr_spill_count"),
        "lds_bytes": lds,
        "waves_per_simd": waves,
        "programs_per_cu": min(waves * CU_SIMDS // warps, CU_LDS[arch] // max(lds, 1)),
    }


def facts(platform, fn, args: tuple, kwargs: dict, dump: Path | None = None) -> dict:
    """One caught launch compiled for ``platform``: its resource use (``error`` if it did not
    compile) and ``nvidia_only``, the NVIDIA-only constructs its LLVM IR holds."""
    from dsv41.nvidia.sm90_compile import compile_sm90

    sig, consts, attrs, options = signature(fn, args, kwargs)
    row = {"kernel": fn.__name__, "warps": options.get("num_warps", 4)}
    try:
        kernel = compile_sm90(fn, sig, consts, attrs, target=platform, **options)
    except Exception as e:  # noqa: BLE001  (a compile error of any kind is the row's finding)
        first = next((line for line in str(e).splitlines() if "error" in line), str(e)[:200])
        return row | {"error": f"{type(e).__name__}: {first.strip()[:200]}"}
    if dump is not None:
        dump.with_suffix(".ttgir").write_text(kernel.asm["ttgir"])
    row["nvidia_only"] = sorted(t for t in NVIDIA_ONLY if t in kernel.asm["llir"])
    if platform.kind == "cuda":
        return row | _nvidia_facts(kernel, row["warps"], dump)
    return row | _amd_facts(kernel, row["warps"], platform.arch, dump)


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


def step_launches(target: str, tp: int, tokens: int, fmt: str, layer_id: int = 1,
                  tuning: dict | None = None) -> list:
    """The caught launches of one nvidia step for ``target``: ``(fn, args, kwargs)`` in order;
    ``tuning``: Tuning fields changed from the target's (``tuning.changed``, dotted names)."""
    from dsv41.common.platform import parse_target, targeting
    from dsv41.nvidia.step import nvidia_step
    from dsv41.nvidia.tuning import changed, tuning_for

    layer, sc = _layer_and_step(tp, tokens, fmt, layer_id)
    calls: list = []
    with targeting(parse_target(target)), seen_as_gpu(layer, target), caught_launches(calls):
        choices = changed(tuning_for(layer.dims, sc.x.device, tokens), tuning or {})
        nvidia_step(layer, sc, tuning=choices)
    return calls


def mono_launches(target: str, tp: int, tokens: int, layer_id: int = 1,
                  tuning: dict | None = None) -> list:
    """The caught launch of one mono step for ``target``: ``[(fn, args, kwargs)]``, a program a
    multiprocessor (mono's records are fp8_ds_mla); ``tuning``: Tuning fields changed from the
    target's measured ones (``tuning.resolve``)."""
    from dsv41.amd.mono.launcher import MonoRunner
    from dsv41.amd.mono.tuning import resolve
    from dsv41.common.platform import parse_target, targeting

    layer, sc = _layer_and_step(tp, tokens, "fp8_ds_mla", layer_id)
    calls: list = []
    with targeting(parse_target(target)), caught_launches(calls):
        choices = resolve(layer.dims, tokens, **(tuning or {}))
        runner = MonoRunner(layer, tokens, programs=MULTIPROCESSORS[target], tuning=choices)
        runner.launch(sc, torch.empty_like(sc.x))
    return calls


def launch_facts(target: str, backend: str, tp: int, tokens: int, fmt: str = "fp8_ds_mla",
                 layer_id: int = 1, dump: Path | None = None,
                 tuning: dict | None = None) -> list[dict]:
    """Every launch of one step compiled for ``target``: a row each, in launch order (a launch
    equal to an earlier one is compiled once); ``tuning``: the backend's Tuning changes."""
    from dsv41.common.platform import parse_target

    platform = parse_target(target)
    if backend == "mono":
        launches = mono_launches(target, tp, tokens, layer_id, tuning)
    else:
        launches = step_launches(target, tp, tokens, fmt, layer_id, tuning)
    rows, seen = [], {}
    for i, (fn, args, kwargs) in enumerate(launches):
        sig, consts, _, options = signature(fn, args, kwargs)
        key = (fn.__name__, repr(sorted(sig.items())), repr(sorted(consts.items())),
               repr(sorted(options.items())))  # fmt: skip
        if key not in seen:
            seen[key] = facts(platform, fn, args, kwargs,
                              dump / f"{i}_{fn.__name__}" if dump else None)  # fmt: skip
        rows.append(dict(seen[key]))
    return rows


def table(rows: list[dict], target: str) -> list[str]:
    """``rows`` as text lines, the target's columns."""
    if target.startswith("sm"):
        out = [f"{'kernel':32} {'warps':>5} {'regs':>4} {'spill':>5} {'shared':>6} {'prog/SM':>7} "
               f"{'sass':>5} {'after wait':>10}  most after the wait"]  # fmt: skip
        for r in rows:
            if "error" in r:
                out.append(f"{r['kernel']:32} {r['warps']:5} FAILS: {r['error']}")
                continue
            top = ", ".join(f"{op} {n}" for op, n in r["top_after_wait"])
            out.append(f"{r['kernel']:32} {r['warps']:5} {r['registers']:4} "
                       f"{r['spilled_bytes']:5} {r['shared_bytes']:6} {r['programs_per_sm']:7} "
                       f"{r['sass']:5} {r['after_wait']!s:>10}  {top}")  # fmt: skip
        return out
    out = [f"{'kernel':32} {'waves':>5} {'vgpr':>4} {'agpr':>4} {'vspill':>6} {'sspill':>6} "
           f"{'LDS':>6} {'waves/SIMD':>10} {'prog/CU':>7}"]  # fmt: skip
    for r in rows:
        if "error" in r:
            out.append(f"{r['kernel']:32} {r['warps']:5} FAILS: {r['error']}")
            continue
        out.append(f"{r['kernel']:32} {r['warps']:5} {r['vgpr']:4} {r['agpr']:4} "
                   f"{r['vgpr_spills']:6} {r['sgpr_spills']:6} {r['lds_bytes']:6} "
                   f"{r['waves_per_simd']:10} {r['programs_per_cu']:7}")  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    from dsv41.common import switches
    from dsv41.common.platform import TARGETS

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="sm90", choices=TARGETS)
    p.add_argument("--backend", default="nvidia", choices=("nvidia", "mono"))
    p.add_argument("--tp", type=int, default=4, choices=(1, 2, 4, 8))
    p.add_argument("--tokens", type=int, default=1)
    p.add_argument("--fmt", default="fp8_ds_mla", choices=("fp8_ds_mla", "fp8_mx"),
                   help="record format (SM90 stores fp8_ds_mla)")
    p.add_argument("--layer", type=int, default=1,
                   help="the model's layer (default 1, uncompressed; the bench's graphs hold "
                        "the compressed layers, the first of them 2)")
    p.add_argument("--json", help="write the rows to this file too")
    p.add_argument("--dump", type=Path, help="write each launch's compiled code to this folder")
    p.add_argument("--tuning", action="append", default=[], metavar="FIELD=VALUE",
                   help="a field of the backend's Tuning changed from the target's "
                        "(repeatable; as dsv41 bench --variant takes them), e.g. "
                        "attention.keys_a=1 or, for mono, num_warps=8")
    a = p.parse_args(argv)
    from dsv41.bench import parse_variant

    tuning = {}
    if a.tuning:
        try:
            tuning = parse_variant(f"{a.backend}:{','.join(a.tuning)}").changes
        except ValueError as e:
            p.error(f"--tuning: {e}")
    if a.backend == "mono" and a.fmt != "fp8_ds_mla":
        p.error(f"--fmt: mono stores fp8_ds_mla records only, got {a.fmt}")
    if a.backend == "mono" and a.tp not in (2, 4):
        p.error(f"--tp: mono's task tables are laid out for tp 2 and 4, got {a.tp}")
    if switches.interpreting():
        sys.exit("kernel_facts: unset TRITON_INTERPRET (the launchers must choose for a GPU)")
    import triton

    if a.dump:
        a.dump.mkdir(parents=True, exist_ok=True)
    rows = launch_facts(a.target, a.backend, a.tp, a.tokens, a.fmt, a.layer, a.dump, tuning)
    print(f"{a.backend}, layer {a.layer}, tp {a.tp}, M = {a.tokens}, {a.fmt}, {a.target}, "
          f"Triton {triton.__version__}: each launch of one step")
    print("\n".join(table(rows, a.target)))
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
