"""What the deterministic TP reduce costs a layer step on TP GPUs (docs/tensor_parallel.md).

Run one process a GPU:

    torchrun --nproc-per-node 2 benchmarks/tp_reduce.py --backend nvidia --tokens 1,48

For each M, every rank captures in CUDA graphs (``dsv41.bench``'s method: many layers back to
back, median replay over the layer count): its share of the step alone, the reduce alone
(``RankReduce`` on a bf16 [M, hidden] partial: all-gather + fp32 sum + bf16), and the step
followed by the reduce; rank 0 also times the whole layer on one GPU (tp 1). Rank 0 prints
us a step (the slowest rank's figure for the graphs holding a collective) and writes
``--json``.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist

from dsv41 import backends, distributed
from dsv41.bench import graph_layers, graph_scenarios, replay_seconds
from dsv41.common.geometry import Dims


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="nvidia", help="nvidia or mono (default nvidia)")
    p.add_argument("--config", default="dsv41-flash", help="model config name or YAML path")
    p.add_argument("--tokens", default="1,48", help="comma-separated token counts M")
    p.add_argument("--layers", type=int, default=None,
                   help="layers in a graph (default: dsv41.bench's, the model's layer count)")
    p.add_argument("--replays", type=int, default=50)
    p.add_argument("--json", default=None, help="write the rows here (rank 0)")
    args = p.parse_args(argv)
    args.tokens = [int(t) for t in args.tokens.split(",")]
    return args


def slowest(seconds: float) -> float:
    """The largest of every rank's ``seconds``."""
    t = torch.tensor([seconds], dtype=torch.float64, device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def main(argv=None) -> int:
    args = parse_args(argv)
    distributed.init()
    tp, rank = dist.get_world_size(), dist.get_rank()
    dims = Dims.of(args.config, tp)
    hidden = dims.model.hidden
    step = backends.get(args.backend).launch
    layers = graph_layers(dims, rank, args.layers)
    n = len(layers)
    reduce = distributed.RankReduce(tp, max(args.tokens), hidden, "cuda")
    single = graph_layers(Dims.of(args.config, 1), 0, n) if rank == 0 else None
    rows = []
    for m in args.tokens:
        scenarios = graph_scenarios(dims, layers, m)
        partial = torch.randn(m, hidden, device="cuda").bfloat16()

        def step_only():
            for lw, sc in zip(layers, scenarios):
                step(lw, sc)

        def reduce_only():
            for _ in range(n):
                reduce(partial)

        def step_and_reduce():
            for lw, sc in zip(layers, scenarios):
                reduce(step(lw, sc))

        dist.barrier()
        t_step = slowest(replay_seconds(step_only, args.replays) / n)
        dist.barrier()
        t_reduce = slowest(replay_seconds(reduce_only, args.replays) / n)
        dist.barrier()
        t_both = slowest(replay_seconds(step_and_reduce, args.replays) / n)
        t_one = None
        if rank == 0:
            one_sc = graph_scenarios(Dims.of(args.config, 1), single, m)
            t_one = replay_seconds(lambda: [step(lw, sc) for lw, sc in zip(single, one_sc)],
                                   args.replays) / n  # fmt: skip
        dist.barrier()
        rows.append({"backend": args.backend, "config": dims.model.name, "tp": tp, "tokens": m,
                     "layers": n, "rank_step_us": t_step * 1e6, "reduce_us": t_reduce * 1e6,
                     "step_with_reduce_us": t_both * 1e6,
                     "single_gpu_step_us": None if t_one is None else t_one * 1e6})  # fmt: skip
    if rank == 0:
        print(f"{dims.model.name} tp {tp} ({dist.get_backend()}), {args.backend}, {n} layers a "
              f"graph; us a step, slowest rank")
        print(f"{'M':>4} {'rank step':>10} {'reduce':>8} {'step+reduce':>12} {'1 GPU (tp 1)':>13} "
              f"{'speedup':>8}")
        for r in rows:
            print(f"{r['tokens']:>4} {r['rank_step_us']:>10.1f} {r['reduce_us']:>8.1f} "
                  f"{r['step_with_reduce_us']:>12.1f} {r['single_gpu_step_us']:>13.1f} "
                  f"{r['single_gpu_step_us'] / r['step_with_reduce_us']:>7.2f}x")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
