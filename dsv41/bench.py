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

(``python benchmarks/bench_layer.py`` takes the same arguments.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

from dsv41.argtypes import HelpFormatter, int_at_least, new_file
from dsv41.backends import NAMES
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
    p.add_argument("--json", type=new_file, default=None, help="write the rows here")
    p.add_argument("--plot", type=new_file, default=None,
                   help="write a PNG of us/step against M (needs matplotlib)")
    args = p.parse_args(argv)
    args.backends = [b.strip() for b in args.backend.split(",") if b.strip()]
    if not args.backends or any(b not in BACKENDS for b in args.backends):
        p.error(f"argument --backend: expected names from {BACKENDS}, got {args.backend!r}")
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


def step_function(backend: str):
    """``step(layer, inputs)`` of a backend: its enqueue-only, graph-capturable launch
    (``dsv41.backends``; the stock peer's step for ``torch``), or why it cannot be had."""
    from dsv41 import backends

    if backend == PEER:
        from dsv41.peer import TorchPeer

        return TorchPeer()
    try:
        return backends.get(backend).launch
    except ImportError as e:
        return f"{backend} backend unavailable: {e}"


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
    """Time every backend of ``args.backends`` at every M; the rows (also printed as a table)."""
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
    steps = {b: step_function(b) for b in args.backends}
    reference = step_function("reference")
    rows: list[dict] = []
    total, done = len(args.tokens) * len(args.backends), 0
    for m in args.tokens:
        scenarios = graph_scenarios(dims, layers, m)
        floor = floor_seconds(w_bytes, m, model, bandwidth)
        ref = time_eager(reference, layers[0], scenarios[0].clone_caches(), args.reference_repeats)
        for backend, step in steps.items():
            progress(done, total, f"{backend} M={m}")
            done += 1
            base = {"backend": backend, "config": model.name, "tp": args.tp, "rank": args.rank,
                    "tokens": m}
            if isinstance(step, str):
                rows.append({**base, "error": step})
                continue
            try:
                per_step = ref if backend == "reference" else (
                    time_graph(step, layers, scenarios, args.replays) / n_layers)
            except (RuntimeError, ValueError) as e:  # e.g. the mono kernel's token limit
                rows.append({**base, "error": f"{type(e).__name__}: {e}"})
                continue
            rows.append({
                **base, "layers": n_layers, "us_per_step": per_step * 1e6, "floor_us": floor * 1e6,
                "ratio_to_floor": per_step / floor, "reference_us": ref * 1e6,
                "speedup_vs_reference": ref / per_step, "weight_bytes": w_bytes,
                "kv_bytes": m * model.keys * record_bytes, "copy_bandwidth": bandwidth,
                "record_format": RECORD_FORMAT,
            })
    progress(total, total, "done")
    add_peer_ratios(rows)
    return rows


def add_peer_ratios(rows: list[dict]) -> None:
    """Each timed row's ``speedup_vs_torch``: the stock peer's us/step at its M over its own."""
    peer = {r["tokens"]: r["us_per_step"] for r in rows if r["backend"] == PEER and "error" not in r}
    for r in rows:
        if "error" not in r and r["tokens"] in peer:
            r["speedup_vs_torch"] = peer[r["tokens"]] / r["us_per_step"]


def format_table(rows: list[dict]) -> str:
    head = (f"{'backend':<10} {'M':>4} {'us/step':>9} {'floor us':>9} {'x floor':>8} "
            f"{'ref us':>9} {'x faster':>9} {'x torch':>8}")
    lines = [head, "-" * len(head)]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['backend']:<10} {r['tokens']:>4}  {r['error']}")
            continue
        peer = f"{r['speedup_vs_torch']:>8.1f}" if "speedup_vs_torch" in r else ""
        lines.append(f"{r['backend']:<10} {r['tokens']:>4} {r['us_per_step']:>9.1f} "
                     f"{r['floor_us']:>9.1f} {r['ratio_to_floor']:>8.2f} {r['reference_us']:>9.1f} "
                     f"{r['speedup_vs_reference']:>9.1f} {peer}".rstrip())
    return "\n".join(lines)


def plot(rows: list[dict], path: str) -> str:
    """A PNG of us/step against M for each backend, the floor as a dashed line; a note on failure."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "plot skipped: matplotlib is not installed (pip install 'dsv41[plot]')"
    ok = [r for r in rows if "error" not in r]
    fig, ax = plt.subplots(figsize=(6, 4))
    for backend in dict.fromkeys(r["backend"] for r in ok):
        pts = [(r["tokens"], r["us_per_step"]) for r in ok if r["backend"] == backend]
        ax.plot(*zip(*pts), marker="o", label=backend)
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
