"""Each stage of a backend's layer step in effective TB/s, beside the copy rate, cuBLAS FP8 on each
projection's shape and a one-launch streaming reference (GPU).

Every figure comes from a CUDA graph over the bench's layers (``dsv41.bench.graph_layers``: the
model's layers, weights past the L2), the median replay over the layer count:

- nvidia, per M: each launch of the step (wqkv, norm, wq_b, attention, combine, wo_a, wo_b, as the
  step makes them) timed alone, the step's other launches left out of the graph, with its bytes
  (weights + codes; records read; split partials read) and TB/s; then the whole step as
  ``dsv41 bench`` times it. mono (one launch): each stage of the step from its task trace
  (``benchmarks/mono_trace.py``), the time from its inputs all ready to its last task's end, the
  median over ``TRACES`` launches of a layer whose weights ran longest ago; then the step.
- cuBLAS FP8 per projection (``torch._scaled_mm``, e4m3 [N, K] weights and row-wise fp32 scales,
  one weight copy a layer), beside our stage: ``x cuBLAS`` = ours / cuBLAS (below 0.5: twice as
  fast). wo_a runs as one [groups * o_rank, 8 * 512] GEMM: its bytes in one launch.
- The floor (``dsv41.bench``'s), and the copy rate: a device-to-device copy of the step's weight
  bytes, one buffer a layer, read + write bytes over its time.
- The reference: the four projections' weight and code bytes of each layer (concatenated) read in
  one launch by ``stream_kernel`` (32 x 512 chunks, 3 programs a SM, loads pipelined across
  chunks), bytes only: the rate a one-launch step could stream at.

    python benchmarks/stream.py --backend nvidia --tp 4 --tokens 1,4,16,48 --json stream.json

``--variant FIELD=VALUE[,...]`` times the backend with its tuning changed, as ``dsv41 bench
--variant BACKEND:...`` does (e.g. ``attention.key_block=16``). Above the CUDA-core buckets Wqkv's
x rounding (``mx_round``) shows as stage ``x_round``.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

from dsv41.argtypes import HelpFormatter, int_at_least, new_file
from dsv41.bench import (
    RECORD_FORMAT,
    parse_variant,
    copy_bandwidth,
    floor_seconds,
    graph_layers,
    graph_scenarios,
    replay_seconds,
    step_function,
    time_graph,
    weight_bytes,
)
from dsv41.common.geometry import TP_SIZES
from dsv41.common.kv_cache import decode_key_table, record_format
from dsv41.common.mx import E4M3, MX_BLOCK
from dsv41.nvidia.tuning import GEMM_SITES, changed, gemm_shapes, tuning_for  # launch order

BACKENDS = ("nvidia", "mono")
REPLAYS = 30
WEIGHTS = {"wqkv": ("wqkv", "wqkv_scale"), "wq_b": ("wq_b", "wq_b_scale"),
           "wo_a": ("wo_a", "wo_a_scale"), "wo_b": ("wo_b", "wo_b_scale")}  # fmt: skip
CHUNK_ROWS, CHUNK_COLS = 32, 512  # the reference's chunk: 32 x 512 bytes, 512 B of codes
PROGRAMS_PER_SM = 3  # three programs a SM stream 2.4x one (shared/probes/README.md)
STREAM_CONFIGS = ((3, 4), (3, 8), (4, 4), (4, 8))  # (pipeline stages, warps); the best is shown
MX: tl.constexpr = tl.constexpr(MX_BLOCK)  # weight bytes a code byte covers
# mono's stages under the names of the nvidia launches doing the same work
MONO_NAMES = {"xq": "x cast", "wqkv": "wqkv", "norm": "norm", "wqb": "wq_b", "attn": "attention",
              "combine": "combine", "woa": "wo_a", "wob": "wo_b"}  # fmt: skip
TRACES = 5  # traced mono launches a token count (the median of each stage's time)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="stream.py", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)  # fmt: skip
    p.add_argument("--backend", choices=BACKENDS, default="nvidia",
                   help="nvidia: every launch alone and the step; mono: each stage of its "
                        "task trace and the step")
    p.add_argument("--config", default="dsv41-flash", help="model config name or YAML path")
    p.add_argument("--tp", type=int, choices=TP_SIZES, default=4, help="tensor-parallel size")
    p.add_argument("--rank", type=int_at_least(0), default=0, help="TP rank timed (below --tp)")
    p.add_argument("--tokens", default="1,4,16,48", help="comma-separated token counts M")
    p.add_argument("--layers", type=int_at_least(1), default=None,
                   help="layers in a graph (default: dsv41 bench's)")
    p.add_argument("--replays", type=int_at_least(1), default=REPLAYS, help="graph replays timed")
    p.add_argument("--json", type=new_file, default=None, help="write the results here")
    p.add_argument("--variant", default=None, metavar="FIELD=VALUE[,...]",
                   help="the backend's tuning changed, as dsv41 bench --variant BACKEND:... says")
    args = p.parse_args(argv)
    try:
        spec = f"{args.backend}:{args.variant}"
        args.changes = parse_variant(spec).changes if args.variant else {}
    except ValueError as e:
        p.error(f"argument --variant: {e}")
    if args.rank >= args.tp:
        p.error(f"argument --rank: expected 0 <= rank < --tp = {args.tp}, got {args.rank}")
    try:
        args.tokens = [int(t) for t in args.tokens.split(",") if t.strip()]
    except ValueError:
        p.error(f"argument --tokens: expected comma-separated ints, got {args.tokens!r}")
    if not args.tokens or min(args.tokens) < 1:
        p.error(f"argument --tokens: expected token counts >= 1, got {args.tokens}")
    from dsv41 import backends

    for m in args.tokens:
        why = backends.limits(args.backend).refusal(args.tp, m)
        if why:
            p.error(f"argument --tokens: {args.backend} cannot run tp {args.tp} with {m} tokens: "
                    f"{why}")  # fmt: skip
    return args


# ----------------------------------------------------------------------------------------------
# One launch of the step at a time


class _Launch:
    """Stands in for a kernel of the nvidia step's modules: notes each launch's label in
    ``launches.seen`` and launches the real kernel only if its index in the step is kept."""

    def __init__(self, kernel, label: str, launches: StepLaunches):
        self.kernel, self.label, self.launches = kernel, label, launches

    def __getitem__(self, grid):
        index = len(self.launches.seen)
        self.launches.seen.append(self.label)
        if self.launches.keep is None or index in self.launches.keep:
            return self.kernel[grid]
        return lambda *args, **kwargs: None

    def __getattr__(self, name: str):  # warmup, run, ...: the real kernel's
        return getattr(self.kernel, name)


class StepLaunches:
    """While entered, the nvidia step's kernels launch through ``_Launch``: ``step(layer, inputs)``
    runs only the launches whose index is in ``keep`` (None: all) and lists every launch's stage
    name in ``stages``."""

    def __init__(self, step):
        self.step, self.keep, self.seen = step, None, []

    @staticmethod
    def _sites():
        from dsv41.nvidia.ops import mega_attention, mx_gemm, mx_round, norm_rope_insert

        return [(mx_gemm, "mx_gemm_kernel", "gemm"),
                (mx_round, "mx_round_kernel", "x_round"),
                (norm_rope_insert, "norm_rope_insert_kernel", "norm"),
                (mega_attention, "mega_attention_kernel", "attention"),
                (mega_attention, "mega_attention_combine_kernel", "combine")]  # fmt: skip

    def __enter__(self) -> StepLaunches:
        self._real = [(mod, name, getattr(mod, name)) for mod, name, _ in self._sites()]
        for (mod, name, kernel), (_, _, label) in zip(self._real, self._sites()):
            setattr(mod, name, _Launch(kernel, label, self))
        return self

    def __exit__(self, *exc) -> None:
        for mod, name, kernel in self._real:
            setattr(mod, name, kernel)

    def __call__(self, layer, inputs):
        self.seen = []
        return self.step(layer, inputs)

    @property
    def stages(self) -> list[str]:
        """The last step's launches by stage: GEMMs named by site, in the step's order."""
        gemms = iter(GEMM_SITES)
        return [next(gemms) if label == "gemm" else label for label in self.seen]


def stage_bytes(stage: str, layer, inputs, partial_bytes: int) -> int | None:
    """What a stage must move: a GEMM its weights and codes, attention the records its key
    table names, the combine the split partials (``partial_bytes``); the norm and x's rounding:
    None (activations only)."""
    if stage in WEIGHTS:
        return sum(getattr(layer, n).numel() * getattr(layer, n).element_size()
                   for n in WEIGHTS[stage])  # fmt: skip
    if stage == "attention":
        comp = inputs.compressed_cache
        valid = decode_key_table(inputs.key_table, inputs.window_cache.num_slots,
                                 0 if comp is None else comp.num_slots)[2]  # fmt: skip
        return int(valid.sum()) * inputs.window_cache.fmt.record_bytes
    if stage == "combine":
        return partial_bytes
    return None


def partials_bytes(dims, tokens: int, device, changes: dict) -> int:
    """Bytes of attention's split partials the combine reads: fp32 o and (max, sum) a head and
    split (the tuning changed as ``changes`` says)."""
    splits = changed(tuning_for(dims, device, tokens), changes).attention.splits
    return 0 if splits == 1 else tokens * dims.heads * splits * (dims.model.head_dim + 2) * 4


# ----------------------------------------------------------------------------------------------
# mono's stages, from its task trace


@functools.cache
def _mono_trace():
    """``benchmarks/mono_trace.py`` (its ``stage_table``), loaded once from beside this file."""
    path = Path(__file__).resolve().with_name("mono_trace.py")
    spec = importlib.util.spec_from_file_location("mono_trace", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mono_partials_bytes(plan, tokens: int) -> int:
    """Bytes of attention's chunk partials mono's combine reads for ``tokens`` tokens: the
    plan's ``part`` (o) and ``pstat`` (max, sum) regions, a token's rows of each."""
    regions = (plan.regions["part"], plan.regions["pstat"])
    return tokens * sum(r.nbytes // r.shape[r.token_dim] for r in regions)


def mono_stage_rows(plan, traces: list[torch.Tensor], layer, inputs) -> list[dict]:
    """Per stage of mono's ``plan``: the median over ``traces`` (task traces of launches of
    ``layer`` on ``inputs``) of the time from the stage's inputs all ready to its last task's end
    (``after_us``), under the nvidia stage's name, with its bytes (``stage_bytes``) and TB/s."""
    tables = [_mono_trace().stage_table(plan, t, layer) for t in traces]
    partials = mono_partials_bytes(plan, inputs.x.shape[0])
    rows = []
    for k, first in enumerate(tables[0]):
        name = MONO_NAMES[first["stage"]]
        us = statistics.median(table[k]["after_us"] for table in tables)
        rows.append({"stage": name, **figure(us / 1e6, stage_bytes(name, layer, inputs, partials))})
    return rows


def mono_traces(layers: list, scenarios: list, tokens: int, count: int, changes: dict) -> tuple:
    """``(plan, traces)``: ``count`` task traces of layer 0's mono launch, each after one launch
    of every other layer, so its weights come from HBM as in the graph; the runners are the
    ones the step's graph replays (``runner_for``; with ``changes``, the variant's)."""
    from dsv41.amd.mono.launcher import runner_for
    from dsv41.amd.mono.tuning import resolve

    tuning = resolve(layers[0].dims, tokens, **changes) if changes else None
    runners = [runner_for(layer, tokens, tuning) for layer in layers]
    ys = [torch.empty_like(sc.x) for sc in scenarios]
    traces = []
    for _ in range(count):
        for runner, sc, y in zip(runners[1:], scenarios[1:], ys[1:]):
            runner.launch(sc, y)
        trace = torch.zeros(runners[0].plan.total_tasks, 3, dtype=torch.int64, device="cuda")
        runners[0].launch(scenarios[0], ys[0], trace=trace)
        traces.append(trace)
    torch.cuda.synchronize()
    runners[0].check()
    return runners[0].plan, traces


# ----------------------------------------------------------------------------------------------
# cuBLAS FP8, the copy and the one-launch reference


def cublas_seconds(n: int, k: int, tokens: int, copies: int, replays: int) -> float:
    """Median seconds of one ``torch._scaled_mm`` of ``tokens`` x ``k`` e4m3 by a [n, k] e4m3
    weight, row-wise fp32 scales, bf16 out; ``copies`` weights in turn."""
    gen = torch.Generator(device="cuda").manual_seed(n + k)
    ws = [torch.randn(n, k, device="cuda", generator=gen).to(E4M3) for _ in range(copies)]
    w_scales = [torch.rand(1, n, device="cuda", generator=gen) + 0.5 for _ in range(copies)]
    a = torch.randn(tokens, k, device="cuda", generator=gen).to(E4M3)
    a_scale = torch.rand(tokens, 1, device="cuda", generator=gen) + 0.5

    def run():
        for w, s in zip(ws, w_scales):
            torch._scaled_mm(a, w.t(), scale_a=a_scale, scale_b=s, out_dtype=torch.bfloat16)

    return replay_seconds(run, replays) / copies


def copy_seconds(nbytes: int, copies: int, replays: int) -> float:
    """Median seconds of one device-to-device copy of ``nbytes``, ``copies`` buffers in turn."""
    src = torch.empty(copies, nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return replay_seconds(lambda: [dst[i].copy_(src[i]) for i in range(copies)], replays) / copies


@triton.jit
def stream_kernel(w_ptr, codes_ptr, out_ptr, chunks, PROGRAMS: tl.constexpr, ROWS: tl.constexpr,
                  COLS: tl.constexpr, STAGES: tl.constexpr):  # fmt: skip
    """Reads ``chunks`` chunks of ROWS x COLS weight bytes and their ROWS x COLS / 32 code bytes
    (chunk i's codes at byte i * ROWS * COLS / 32), program p taking chunks p, p + PROGRAMS, ...;
    ``out[p, r]`` = the int32 sum of its row r's bytes, so nothing read is dead."""
    pid = tl.program_id(0)
    rows = tl.arange(0, ROWS)
    acc = tl.zeros([ROWS], dtype=tl.int32)
    for i in tl.range(pid, chunks, PROGRAMS, num_stages=STAGES):
        base = i * (ROWS * COLS)  # int32: a layer's buffer is far below 2 GiB
        w = tl.load(w_ptr + base + rows[:, None] * COLS + tl.arange(0, COLS)[None, :])
        codes = tl.load(codes_ptr + base // MX + rows[:, None] * (COLS // MX)
                        + tl.arange(0, COLS // MX)[None, :])  # fmt: skip
        acc += tl.sum(w.to(tl.int32), axis=1) + tl.sum(codes.to(tl.int32), axis=1)
    tl.store(out_ptr + pid * ROWS + rows, acc)


def stream_buffers(layer) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weights, codes)`` uint8: a layer's four projections' e4m3 bytes end to end, padded with
    zeros to whole chunks, and their codes likewise (code j of the flat weights is byte j / 32:
    each weight ``[N, K]`` and its codes ``[N, K / 32]`` are row-major)."""
    chunk = CHUNK_ROWS * CHUNK_COLS
    w = torch.cat([getattr(layer, WEIGHTS[s][0]).view(torch.uint8).flatten() for s in GEMM_SITES])
    codes = torch.cat([getattr(layer, WEIGHTS[s][1]).flatten() for s in GEMM_SITES])
    pad = -w.numel() % chunk
    w = torch.cat([w, w.new_zeros(pad)])
    return w, torch.cat([codes, codes.new_zeros(pad // MX_BLOCK)])


def stream(w: torch.Tensor, codes: torch.Tensor, out: torch.Tensor, programs: int, stages: int,
           warps: int) -> None:  # fmt: skip
    """``stream_kernel`` over one layer's buffers; ``out`` int32 [programs, CHUNK_ROWS]."""
    chunks = w.numel() // (CHUNK_ROWS * CHUNK_COLS)
    stream_kernel[(programs,)](w, codes, out, chunks, PROGRAMS=programs, ROWS=CHUNK_ROWS,
                               COLS=CHUNK_COLS, STAGES=stages, num_warps=warps)  # fmt: skip


def reference_seconds(layers: list, replays: int) -> tuple[float, dict]:
    """The best of ``STREAM_CONFIGS``: median seconds a layer of ``stream`` over every layer's
    buffers in one graph, and its config."""
    from dsv41.nvidia.ops.launch import sm_count

    bufs = [stream_buffers(lw) for lw in layers]
    programs = PROGRAMS_PER_SM * sm_count(torch.device("cuda"))
    out = torch.empty(programs, CHUNK_ROWS, dtype=torch.int32, device="cuda")
    best = None
    for stages, warps in STREAM_CONFIGS:
        def run(stages=stages, warps=warps):
            for w, codes in bufs:
                stream(w, codes, out, programs, stages, warps)

        t = replay_seconds(run, replays) / len(bufs)
        if best is None or t < best[0]:
            best = (t, {"programs": programs, "stages": stages, "warps": warps})
    return best


# ----------------------------------------------------------------------------------------------
# The run


def attempt(what: str, timed):
    """``timed()`` (seconds), or the error it raised as a string, printed: one figure that cannot
    be had (a shape cuBLAS refuses, a compile failure) leaves the run's others."""
    try:
        return timed()
    except Exception as e:  # noqa: BLE001 -- reported in the table and the JSON, the run goes on
        why = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
        print(f"{what}: {why}", file=sys.stderr)
        return why


def figure(seconds, nbytes: int | None, **extra) -> dict:
    """A timed figure as a row: us, bytes, TB/s, or the error it gave."""
    if isinstance(seconds, str):
        return {"error": seconds, "bytes": nbytes, **extra}
    return {"us": seconds * 1e6, "bytes": nbytes,
            "tb_s": nbytes / seconds / 1e12 if nbytes else None, **extra}  # fmt: skip


def run(args: argparse.Namespace) -> dict:
    """Every figure of the module docstring, per M; also printed as tables."""
    from dsv41.common.geometry import Dims

    dims = Dims.of(args.config, args.tp)
    model = dims.model
    layers = graph_layers(dims, args.rank, args.layers)
    n_layers, w_bytes = len(layers), weight_bytes(layers[0])
    proj_bytes = sum(stage_bytes(s, layers[0], None, 0) for s in GEMM_SITES)
    bandwidth = copy_bandwidth()
    copy_t = copy_seconds(w_bytes, n_layers, args.replays)
    best = attempt("reference", lambda: reference_seconds(layers, args.replays))
    reference = (figure(best, proj_bytes) if isinstance(best, str)
                 else figure(best[0], proj_bytes, **best[1]))  # fmt: skip
    result = {
        "config": model.name, "tp": args.tp, "rank": args.rank, "backend": args.backend,
        "variant": args.variant,
        "layers": n_layers, "weight_bytes": w_bytes, "record_format": RECORD_FORMAT,
        "copy_bandwidth": bandwidth,
        "copy": {"us": copy_t * 1e6, "bytes": w_bytes, "tb_s": 2 * w_bytes / copy_t / 1e12},
        "reference": reference, "tokens": [],
    }  # fmt: skip
    print(f"{model.name} tp {args.tp} rank {args.rank}, {args.backend}: {n_layers} layers of "
          f"{w_bytes / 1e6:.1f} MB a graph; copy bandwidth {bandwidth / 1e12:.2f} TB/s (2 GB, "
          f"read + write)")  # fmt: skip
    print(f"copy of a layer's weights, one buffer a layer: {copy_t * 1e6:.2f} us, "
          f"{result['copy']['tb_s']:.2f} TB/s read + write")
    if "error" in reference:
        print(f"reference (one-launch streaming): {reference['error']}")
    else:
        config = {k: reference[k] for k in ("programs", "stages", "warps")}
        print(f"reference, the four projections' {proj_bytes / 1e6:.1f} MB in one launch (bytes "
              f"only, {config}): {reference['us']:.2f} us, {reference['tb_s']:.2f} TB/s")
    shapes = gemm_shapes(dims)
    step = step_function(args.backend, args.changes)
    if isinstance(step, str):
        raise RuntimeError(step)
    for m in args.tokens:
        scenarios = graph_scenarios(dims, layers, m)
        floor = floor_seconds(w_bytes, m, model, bandwidth)
        kv_bytes = m * model.keys * record_format(RECORD_FORMAT).record_bytes
        stages = []
        if args.backend == "nvidia":
            partials = partials_bytes(dims, m, torch.device("cuda"), args.changes)
            with StepLaunches(step) as launches:
                launches(layers[0], scenarios[0])
                for i, name in enumerate(launches.stages):
                    launches.keep = {i}
                    t = attempt(f"M = {m} {name}", lambda: time_graph(
                        launches, layers, scenarios, args.replays) / n_layers)  # fmt: skip
                    nbytes = stage_bytes(name, layers[0], scenarios[0], partials)
                    stages.append({"stage": name, **figure(t, nbytes)})
        else:
            traced = attempt(f"M = {m} mono trace",
                             lambda: mono_traces(layers, scenarios, m, TRACES,
                                                 args.changes))  # fmt: skip
            if isinstance(traced, str):
                stages.append({"stage": "trace", "error": traced, "bytes": None})
            else:
                stages = mono_stage_rows(*traced, layers[0], scenarios[0])
        step_t = time_graph(step, layers, scenarios, args.replays) / n_layers
        ours = {s["stage"]: s for s in stages}
        for site in GEMM_SITES:
            n, k, _, _ = shapes[site]
            t = attempt(f"M = {m} cuBLAS {site}",
                        lambda: cublas_seconds(n, k, m, n_layers, args.replays))  # fmt: skip
            row = ours.get(site)
            if row is None:
                row = {"stage": site}
                stages.append(row)
            if isinstance(t, str):
                row["cublas_error"] = t
                continue
            row["cublas_us"] = t * 1e6
            if "us" in row:
                row["x_cublas"] = row["us"] / row["cublas_us"]
        result["tokens"].append({
            "tokens": m, "floor_us": floor * 1e6, "stages": stages,
            "step": {"us": step_t * 1e6, "bytes": w_bytes + kv_bytes,
                     "tb_s": (w_bytes + kv_bytes) / step_t / 1e12, "x_floor": step_t / floor},
        })  # fmt: skip
        print(format_table(result["tokens"][-1]))
    return result


def format_table(per_m: dict) -> str:
    """One M's stages, the step and the floor as a table."""
    head = f"{'stage':<10} {'us':>8} {'MB':>8} {'TB/s':>6} {'cuBLAS us':>10} {'x cuBLAS':>9}"
    lines = [f"\nM = {per_m['tokens']}", head, "-" * len(head)]

    def cell(value, fmt: str, width: int) -> str:
        return f"{value:>{width}{fmt}}" if value is not None else f"{'-':>{width}}"

    for s in per_m["stages"]:
        lines.append(f"{s['stage']:<10} {cell(s.get('us'), '.2f', 8)} "
                     f"{cell(s['bytes'] / 1e6 if s.get('bytes') else None, '.2f', 8)} "
                     f"{cell(s.get('tb_s'), '.2f', 6)} {cell(s.get('cublas_us'), '.2f', 10)} "
                     f"{cell(s.get('x_cublas'), '.2f', 9)}".rstrip())  # fmt: skip
        for key, what in (("error", "ours"), ("cublas_error", "cuBLAS")):
            if key in s:
                lines.append(f"{'':<10} {what}: {s[key]}")
    st = per_m["step"]
    lines.append(f"{'step':<10} {st['us']:>8.2f} {st['bytes'] / 1e6:>8.2f} {st['tb_s']:>6.2f}  "
                 f"({st['x_floor']:.2f} x the floor, {per_m['floor_us']:.2f} us)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("stream.py: needs a CUDA GPU (torch.cuda.is_available() is False); its timing is "
              "graph replay on the GPU", file=sys.stderr)  # fmt: skip
        return 2
    result = run(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    rows = [result["reference"]] + [s for m in result["tokens"] for s in m["stages"]]
    return 1 if any("error" in r or "cublas_error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
