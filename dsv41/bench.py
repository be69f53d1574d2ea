"""Microseconds per layer step of a backend at a TP share, vs the docs/design.md §8 floor and the
reference.

For each token count M the script builds ``--layers`` layers (random MXFP8 weights of the rank,
each with its own caches; by default as many as the model has, as a server's decode graph holds,
and at least enough that their weights exceed the GPU's L2 so every step streams them from HBM),
captures one step of every layer back to back in one CUDA graph, replays it many times and
reports the median over replays (CUDA events) divided by the layer count (a replay's own start
is paid once a graph: about 1.3 us a step at 4 layers, 0.1 at 40, on the H200). The
floor is ``(rank weight bytes incl. scales + M * KEYS * record bytes) / copy bandwidth``, the
bandwidth measured in the same run by a large device-to-device copy (read + write bytes over its
time). The eager reference (``reference_step`` on the same GPU tensors) is timed with fewer
repeats. Figures go to BENCHMARKS.md.

    dsv41 bench --backend nvidia,mono,torch --config dsv41-flash --tp 4 \\
        --tokens 1,2,4,8,16,32,48 --json bench.json --plot bench.png

``--backend torch`` is the stock peer (``dsv41/peer.py``, bench only): the step from stock
PyTorch parts, ``torch._scaled_mm`` FP8 GEMMs with row-wise scales, keys gathered through the key
table, a torch softmax with the sink, captured in the same graph; each other row's
``x torch`` is its speed-up over it.

``--variant nvidia:wo_a.block_k=128,pdl=0`` (repeatable) adds rows of a kernel backend with its
tuning changed, timed in the same run, with their last layer's max |y - y of the default row|.

(``python benchmarks/bench_layer.py`` takes the same arguments.)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import typing

import torch

from dsv41 import backends
from dsv41.argtypes import HelpFormatter, int_at_least, new_file
from dsv41.backends import KERNEL_BACKENDS, NAMES
from dsv41.common.geometry import TP_SIZES

PEER = "torch"  # the stock peer's name (dsv41/peer.py): a bench row, not a serving backend
BACKENDS = (*NAMES, PEER)

L2_BYTES = 60 * 2**20  # H200 L2: the weights of the layers in a graph must exceed it
L2_MARGIN = 2.5  # weights in a graph >= this many L2s, so no replay finds them cached
COPY_BYTES = 2 * 2**30  # the bandwidth probe's buffer
REPLAYS = 50
REFERENCE_REPEATS = 5
# SM90's record format (docs/design.md §4); the mono kernel reads only it
RECORD_FORMAT = "fp8_ds_mla"
BOOLS = {"0": False, "1": True, "false": False, "true": True}  # a --variant's bool values


@dataclasses.dataclass(frozen=True)
class Variant:
    """A ``--variant``: a kernel backend's launch choices changed, timed beside its default."""

    backend: str
    changes: dict[str, object]  # Tuning field (dotted: a nested one's) -> value
    label: str  # the FIELD=VALUE list as given: the rows' "variant"


def tuning_fields(cls: type, prefix: str = "") -> dict[str, object]:
    """``{name: type}`` of every field a ``--variant`` may set in the dataclass ``cls``, a nested
    dataclass's fields under dotted names (``wo_a.block_k``)."""
    hints = typing.get_type_hints(cls)
    out: dict[str, object] = {}
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            out.update(tuning_fields(hint, f"{prefix}{f.name}."))
        else:
            out[prefix + f.name] = hint
    return out


def field_list(names: list[str]) -> str:
    """Field names for an error, nested ones braced by the dataclasses that share them:
    ``pdl, {wq_b, wo_a}.{block_k, split_k}``."""
    nested: dict[str, list[str]] = {}
    for name in names:
        head, _, field = name.rpartition(".")
        nested.setdefault(head, []).append(field)
    heads: dict[tuple[str, ...], list[str]] = {}  # the fields -> the dataclasses holding them
    for head, fields in nested.items():
        heads.setdefault(tuple(fields), []).append(head)
    brace = lambda xs: xs[0] if len(xs) == 1 else "{" + ", ".join(xs) + "}"  # noqa: E731
    return ", ".join(", ".join(fields) if hs == [""] else f"{brace(hs)}.{brace(fields)}"
                     for fields, hs in heads.items())  # fmt: skip


def parse_value(text: str, hint: object) -> object:
    """``text`` as a value of type ``hint``: an int, a bool (0, 1, true, false), either or None;
    ValueError saying what was expected."""
    options = typing.get_args(hint)
    if type(None) in options:
        if text.lower() == "none":
            return None
        (hint,) = (o for o in options if o is not type(None))
    if hint is bool:
        if text.lower() in BOOLS:
            return BOOLS[text.lower()]
    else:
        try:
            return hint(text)
        except ValueError:
            pass
    kind = "0, 1, true or false" if hint is bool else f"an {hint.__name__}"
    kind += " or None" if type(None) in options else ""
    raise ValueError(f"expected {kind}, got {text!r}")


def parse_variant(spec: str) -> Variant:
    """``BACKEND:FIELD=VALUE[,FIELD=VALUE...]`` as a ``Variant``, each VALUE parsed to its
    field's type; ValueError saying what was expected and what came."""
    backend, colon, body = (part.strip() for part in spec.partition(":"))
    if backend not in KERNEL_BACKENDS or not colon:
        raise ValueError(f"expected BACKEND:FIELD=VALUE[,FIELD=VALUE...] with BACKEND in "
                         f"{KERNEL_BACKENDS}, got {spec!r}")  # fmt: skip
    try:
        fields = tuning_fields(backends.tuning_type(backend))
    except ImportError as e:
        raise ValueError(f"{backend} backend unavailable: {e}") from None
    changes: dict[str, object] = {}
    items = [item.strip() for item in body.split(",")]
    for item in items:
        name, eq, text = (part.strip() for part in item.partition("="))
        if not eq or not text:
            raise ValueError(f"expected FIELD=VALUE after {backend}:, got {item!r} in {spec!r}")
        if name not in fields:
            raise ValueError(f"expected a field of {backend}'s Tuning "
                             f"({field_list(list(fields))}), got {name!r}")  # fmt: skip
        if name in changes:
            raise ValueError(f"expected each field once, got {name!r} twice in {spec!r}")
        try:
            changes[name] = parse_value(text, fields[name])
        except ValueError as e:
            raise ValueError(f"{backend} {name}: {e}") from None
    return Variant(backend, changes, ",".join(items))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="dsv41 bench", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)  # fmt: skip
    p.add_argument("--backend", default="nvidia",
                   help="comma-separated backends: nvidia, mono, reference, torch (the stock "
                   "peer: torch._scaled_mm FP8 GEMMs with row-wise scales, gathered keys, a torch "
                   "softmax attention; bench only)")
    p.add_argument("--config", default="dsv41-flash", help="model config name or YAML path")
    p.add_argument("--tp", type=int, choices=TP_SIZES, default=4,
                   help="tensor-parallel size; rank --rank's share is timed")
    p.add_argument("--rank", type=int_at_least(0), default=0, help="TP rank timed (below --tp)")
    p.add_argument("--tokens", default="1,2,4,8,16,32,48", help="comma-separated token counts M")
    p.add_argument(
        "--layers",
        type=int_at_least(1),
        default=None,
        help=f"layers in a graph (default: the model's layer count, at least enough for "
        f"{L2_MARGIN} x the {L2_BYTES >> 20} MB L2)",
    )
    p.add_argument("--replays", type=int_at_least(1), default=REPLAYS, help="graph replays timed")
    p.add_argument("--reference-repeats", type=int_at_least(1), default=REFERENCE_REPEATS,
                   help="eager reference steps timed")
    p.add_argument("--variant", action="append", metavar="BACKEND:FIELD=VALUE[,...]",
                   help="rows of a backend of --backend with its launch choices changed (nvidia: "
                   "dsv41/nvidia/tuning.py, a dotted name for a nested field, wo_a.block_k=128; "
                   "mono: dsv41/amd/mono/tuning.py); repeatable")
    p.add_argument("--json", type=new_file, default=None, help="write the rows here")
    p.add_argument("--plot", type=new_file, default=None,
                   help="write a PNG of us/step against M (needs matplotlib)")
    args = p.parse_args(argv)
    args.backends = [b.strip() for b in args.backend.split(",") if b.strip()]
    if not args.backends or any(b not in BACKENDS for b in args.backends):
        p.error(f"argument --backend: expected names from {BACKENDS}, got {args.backend!r}")
    try:
        args.variants = [parse_variant(spec) for spec in args.variant or []]
    except ValueError as e:
        p.error(f"argument --variant: {e}")
    for v in args.variants:
        if v.backend not in args.backends:
            p.error(f"argument --variant: expected a backend of --backend ({args.backend}) to "
                    f"compare with, got {v.backend!r}")  # fmt: skip
    if args.rank >= args.tp:
        p.error(f"argument --rank: expected 0 <= rank < --tp = {args.tp}, got {args.rank}")
    try:
        args.tokens = [int(t) for t in args.tokens.split(",") if t]
    except ValueError:
        p.error(f"argument --tokens: expected comma-separated ints, got {args.tokens!r}")
    if not args.tokens or min(args.tokens) < 1:
        p.error(f"argument --tokens: expected token counts >= 1, got {args.tokens}")
    return args


def copy_bandwidth() -> float:
    """Bytes a second of a large device-to-device copy, counting the read and the write."""
    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * COPY_BYTES / statistics.median(times)


def floor_seconds(w_bytes: int, tokens: int, model, bandwidth: float) -> float:
    """The step's floor (docs/design.md §8): ``(weight bytes + M x KEYS x record bytes) / copy
    bandwidth``."""
    from dsv41.common.kv_cache import record_format

    return (w_bytes + tokens * model.keys * record_format(RECORD_FORMAT).record_bytes) / bandwidth


def weight_bytes(layer) -> int:
    """Bytes of a rank's kernel-visible parameters (e4m3, scales, norms, sinks)."""
    return sum(p.numel() * p.element_size() for p in layer.parameters())


def compressed_layer(config: str, tp: int, seed: int, device: str = "cuda"):
    """``(dims, layer)``: the last rank's dummy-loaded weights of the model's first compressed
    layer (one that reads both caches), as the profiling scripts use it."""
    from dsv41.common.geometry import Dims
    from dsv41.common.weights import LayerWeights

    dims = Dims.of(config, tp)
    layer_id = next(i for i, r in enumerate(dims.model.compress_ratios) if r)
    layer = LayerWeights(dims, tp - 1, layer_id, device=device)
    layer.dummy_load(seed=seed)
    return dims, layer


def step_function(backend: str, changes: dict[str, object] | None = None):
    """``step(layer, inputs)`` of a backend: its enqueue-only, graph-capturable launch
    (``dsv41.backends``; with its tuning changed as ``changes`` says, ``launch_with``; the stock
    peer's step for ``torch``), or why it cannot be had."""
    if backend == PEER:
        from dsv41.peer import TorchPeer

        return TorchPeer()
    try:
        return backends.launch_with(backend, changes) if changes else backends.get(backend).launch
    except ImportError as e:
        return f"{backend} backend unavailable: {e}"


class LastOutput:
    """A step that keeps its last call's output: in a graph, the captured y its replays write."""

    def __init__(self, step):
        self.step, self.y = step, None

    def __call__(self, layer, inputs) -> torch.Tensor:
        self.y = self.step(layer, inputs)
        return self.y


def layer_steps(step, layers, scenarios):
    """What a timing graph captures: one step of every layer, back to back."""

    def run():
        for layer, sc in zip(layers, scenarios):
            step(layer, sc)

    return run


def time_graph(step, layers, scenarios, replays: int) -> float:
    """Median seconds of one replay of a graph holding one step of every layer."""
    return replay_seconds(layer_steps(step, layers, scenarios), replays)


def capture_graph(run) -> torch.cuda.CUDAGraph:
    """A CUDA graph capturing ``run()`` (run once before, on a side stream: compiles and sizes
    scratch), replayed once."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def replay_seconds(run, replays: int) -> float:
    """Median seconds of one replay of a CUDA graph capturing ``run()`` (``capture_graph``)."""
    graph = capture_graph(run)
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def time_eager(step, layer, sc, repeats: int) -> float:
    """Median seconds of one eager step (host syncs included, as the reference has them)."""
    step(layer, sc)
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step(layer, sc)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def progress(done: int, total: int, label: str) -> None:
    """A one-line progress bar on stderr."""
    width = 30
    filled = width * done // max(total, 1)
    end = "\n" if done == total else ""
    print(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {label:<24}", end=end,
          file=sys.stderr, flush=True)


def graph_layers(dims, rank: int, n_layers: int | None = None) -> list:
    """The layers one timing graph holds back to back: rank ``rank``'s dummy-loaded weights of
    the model's compressed layers in turn (of every layer if none is compressed); ``n_layers``
    of them, by default the model's layer count (a server's decode graph holds every layer, so
    a replay's own start is spread over that many steps), and at least enough that their
    weights exceed ``L2_MARGIN`` x the L2."""
    from dsv41.common.weights import LayerWeights

    model = dims.model
    compressed = [i for i, r in enumerate(model.compress_ratios) if r] or list(range(model.num_layers))
    one = LayerWeights(dims, rank, compressed[0], device="cuda")
    past_l2 = -(-int(L2_MARGIN * L2_BYTES) // weight_bytes(one))
    n_layers = n_layers or max(2, model.num_layers, past_l2)
    layers = [one] + [
        LayerWeights(dims, rank, compressed[i % len(compressed)], device="cuda")
        for i in range(1, n_layers)
    ]
    for i, lw in enumerate(layers):
        lw.dummy_load(seed=i)
    return layers


def graph_scenarios(dims, layers: list, m: int) -> list:
    """One step of ``m`` tokens for each of ``layers``, each with its own caches."""
    from dsv41.common.scenario import make_scenario

    model = dims.model
    return [
        make_scenario(dims, lw.layer_id, m, fmt=RECORD_FORMAT, seed=100 * i + m, device="cuda",
                      compressed_rows=max(2 * model.topk, m * model.topk))
        for i, lw in enumerate(layers)
    ]


def run(args: argparse.Namespace) -> list[dict]:
    """Time every backend of ``args.backends``, each followed by its ``args.variants``, at every
    M; the rows (also printed as a table)."""
    from triton.errors import TritonError

    from dsv41.common.geometry import Dims
    from dsv41.common.kv_cache import record_format

    dims = Dims.of(args.config, args.tp)
    model = dims.model
    layers = graph_layers(dims, args.rank, args.layers)
    w_bytes, n_layers = weight_bytes(layers[0]), len(layers)
    bandwidth = copy_bandwidth()
    record_bytes = record_format(RECORD_FORMAT).record_bytes
    print(f"{model.name} tp {args.tp} rank {args.rank}: {n_layers} layers of {w_bytes / 1e6:.1f} MB "
          f"weights per graph; copy bandwidth {bandwidth / 1e12:.2f} TB/s; {RECORD_FORMAT}")
    steps = []  # (backend, variant label or None, step): each backend, then its variants
    for b in args.backends:
        steps.append((b, None, step_function(b)))
        steps += [(b, v.label, step_function(b, v.changes)) for v in args.variants
                  if v.backend == b]  # fmt: skip
    reference = step_function("reference")
    rows: list[dict] = []
    total, done = len(args.tokens) * len(steps), 0
    for m in args.tokens:
        scenarios = graph_scenarios(dims, layers, m)
        floor = floor_seconds(w_bytes, m, model, bandwidth)
        ref = time_eager(reference, layers[0], scenarios[0].clone_caches(), args.reference_repeats)
        default_y = {}  # backend -> its default row's last-layer y at this M
        for backend, variant, step in steps:
            base = {"backend": backend, "config": model.name, "tp": args.tp, "rank": args.rank,
                    "tokens": m}
            if variant is not None:
                base["variant"] = variant
            progress(done, total, f"{label(base)} M={m}")
            done += 1
            if isinstance(step, str):
                rows.append({**base, "error": step})
                continue
            last = LastOutput(step)
            try:
                per_step = ref if backend == "reference" else (
                    time_graph(last, layers, scenarios, args.replays) / n_layers)
            # e.g. the mono kernel's token limit, a variant's refused or uncompilable tiles
            except (RuntimeError, ValueError, TritonError) as e:
                rows.append({**base, "error": f"{type(e).__name__}: {e}"})
                continue
            row = {
                **base, "layers": n_layers, "us_per_step": per_step * 1e6, "floor_us": floor * 1e6,
                "ratio_to_floor": per_step / floor, "reference_us": ref * 1e6,
                "speedup_vs_reference": ref / per_step, "weight_bytes": w_bytes,
                "kv_bytes": m * model.keys * record_bytes, "copy_bandwidth": bandwidth,
                "record_format": RECORD_FORMAT,
            }
            if variant is None:
                default_y[backend] = last.y
            elif last.y is not None and default_y.get(backend) is not None:
                # every step inserts its own records before attention reads them, so the last
                # layer's y depends on the step alone, not on which row ran before it
                dy = (last.y.float() - default_y[backend].float()).abs().max()
                row["y_vs_default"] = dy.item()
            rows.append(row)
    progress(total, total, "done")
    add_peer_ratios(rows)
    return rows


def add_peer_ratios(rows: list[dict]) -> None:
    """Each timed row's ``speedup_vs_torch``: the stock peer's us/step at its M over its own."""
    peer = {r["tokens"]: r["us_per_step"] for r in rows if r["backend"] == PEER and "error" not in r}
    for r in rows:
        if "error" not in r and r["tokens"] in peer:
            r["speedup_vs_torch"] = peer[r["tokens"]] / r["us_per_step"]


def label(row: dict) -> str:
    """A row's name in the table and plot: its backend, then any variant in brackets."""
    return row["backend"] + (f"[{row['variant']}]" if "variant" in row else "")


def format_table(rows: list[dict]) -> str:
    """The rows as a table; ``y vs def`` (with variants only): max |y - y of the default row|
    at the last layer, 0 where bit-equal."""
    w = max([10] + [len(label(r)) for r in rows])
    head = (f"{'backend':<{w}} {'M':>4} {'us/step':>9} {'floor us':>9} {'x floor':>8} "
            f"{'ref us':>9} {'x faster':>9} {'x torch':>8}")
    head += f" {'y vs def':>9}" if any("variant" in r for r in rows) else ""
    lines = [head, "-" * len(head)]
    for r in rows:
        if "error" in r:
            lines.append(f"{label(r):<{w}} {r['tokens']:>4}  {r['error']}")
            continue
        peer = f"{r['speedup_vs_torch']:>8.1f}" if "speedup_vs_torch" in r else " " * 8
        dy = f" {r['y_vs_default']:>9.3g}" if "y_vs_default" in r else ""
        lines.append(f"{label(r):<{w}} {r['tokens']:>4} {r['us_per_step']:>9.1f} "
                     f"{r['floor_us']:>9.1f} {r['ratio_to_floor']:>8.2f} {r['reference_us']:>9.1f} "
                     f"{r['speedup_vs_reference']:>9.1f} {peer}{dy}".rstrip())
    return "\n".join(lines)


def plot(rows: list[dict], path: str) -> str:
    """A PNG of us/step against M for each backend and variant, the floor as a dashed line; a
    note on failure."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "plot skipped: matplotlib is not installed (pip install 'dsv41[plot]')"
    ok = [r for r in rows if "error" not in r]
    fig, ax = plt.subplots(figsize=(6, 4))
    for name in dict.fromkeys(label(r) for r in ok):
        pts = [(r["tokens"], r["us_per_step"]) for r in ok if label(r) == name]
        ax.plot(*zip(*pts), marker="o", label=name)
    floor = sorted({(r["tokens"], r["floor_us"]) for r in ok})
    if floor:
        ax.plot(*zip(*floor), linestyle="--", color="black", label="floor (docs/design.md §8)")
    ax.set_xlabel("tokens a step (M)")
    ax.set_ylabel("us per layer step")
    ax.set_title(f"{ok[0]['config']} tp {ok[0]['tp']}" if ok else "no rows")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return f"plot written to {path}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("dsv41 bench: needs a CUDA GPU (torch.cuda.is_available() is False); "
              "use `dsv41 parity` or the tests on a CPU machine", file=sys.stderr)
        return 2
    rows = run(args)
    print(format_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if args.plot:
        print(plot(rows, args.plot))
    return 1 if any("error" in row for row in rows) else 0
