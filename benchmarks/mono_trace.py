"""Where a mono step's time goes: every task's start and end on the GPU clock, per stage (GPU).

Launches the mono kernel with its task trace (``MonoRunner.launch(..., trace=)``)
after a few untraced warm-up launches, then prints per stage: the tasks, when
the first started and the last ended (us from the step's first task start),
the mean and longest task, and the stage's weight MB and the TB/s its span
implies. A task's time includes its waits for the stage before. Then, from the
moment the stage before ended ("ready": its inputs are all there): how long the
stage ran on after it, each task's mean time past it (its end less the later of
its start and ready), and the most tasks one program ran in the stage.

    python benchmarks/mono_trace.py --tp 4 --tokens 1,48
"""

from __future__ import annotations

import argparse

import torch

from dsv41.amd.mono.launcher import MonoRunner
from dsv41.bench import compressed_layer
from dsv41.common.scenario import make_scenario
from dsv41.common.weights import LayerWeights

WEIGHTS = {"wqkv": ("wqkv", "wqkv_scale"), "wqb": ("wq_b", "wq_b_scale"),
           "woa": ("wo_a", "wo_a_scale"), "wob": ("wo_b", "wo_b_scale")}


def stage_table(plan, trace: torch.Tensor, layer: LayerWeights) -> list[dict]:
    """Per stage of ``plan``: task count, first start and last end (us from the step's first
    start), mean and longest task (us), weight MB; ``ready_us`` (the stage before's last end;
    the step's start for the first), ``after_us`` (last end - ready), ``work_us`` (mean of end
    - max(start, ready)) and ``per_program`` (the most tasks one program ran)."""
    t = trace.cpu().double()
    origin = t[:, 0].min()
    rows = []
    ready = origin
    for st in plan.stages:
        part = t[st.first : st.end]
        if part.shape[0] == 0:
            continue
        took = (part[:, 1] - part[:, 0]) / 1e3
        past = (part[:, 1] - torch.clamp(part[:, 0], min=ready)) / 1e3
        mb = sum(getattr(layer, n).numel() for n in WEIGHTS.get(st.name, ())) / 1e6
        last = part[:, 1].max()
        rows.append({
            "stage": st.name, "tasks": part.shape[0],
            "first_us": float((part[:, 0].min() - origin) / 1e3),
            "last_us": float((last - origin) / 1e3),
            "mean_us": float(took.mean()), "max_us": float(took.max()), "weight_mb": mb,
            "ready_us": float((ready - origin) / 1e3), "after_us": float((last - ready) / 1e3),
            "work_us": float(past.mean()),
            "per_program": int(torch.unique(part[:, 2], return_counts=True)[1].max()),
        })
        ready = last
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="dsv41-flash")
    p.add_argument("--tp", type=int, default=4)
    p.add_argument("--tokens", default="1,48")
    p.add_argument("--warmup", type=int, default=5)
    args = p.parse_args()
    dims, layer = compressed_layer(args.config, args.tp, seed=1)
    for m in [int(x) for x in args.tokens.split(",")]:
        sc = make_scenario(dims, layer.layer_id, m, seed=m, device="cuda")
        runner = MonoRunner(layer, m)
        y = torch.empty_like(sc.x)
        for _ in range(args.warmup):
            runner.launch(sc, y)
        trace = torch.zeros(runner.plan.total_tasks, 3, dtype=torch.int64, device="cuda")
        runner.launch(sc, y, trace=trace)
        torch.cuda.synchronize()
        runner.check()
        rows = stage_table(runner.plan, trace, layer)
        span = max(r["last_us"] for r in rows)
        print(f"\nmono tp {args.tp}, M = {m}: {runner.programs} programs, step span {span:.1f} us "
              "(first task start to last task end)")
        print(f"{'stage':<8} {'tasks':>5} {'first us':>9} {'last us':>8} {'mean us':>8} "
              f"{'max us':>7} {'MB':>6} {'TB/s':>6} {'ready us':>9} {'after us':>9} "
              f"{'work us':>8} {'per prog':>8}")
        for r in rows:
            rate = r["weight_mb"] / (r["last_us"] - r["first_us"]) if r["weight_mb"] else 0  # MB/us
            print(f"{r['stage']:<8} {r['tasks']:>5} {r['first_us']:>9.1f} {r['last_us']:>8.1f} "
                  f"{r['mean_us']:>8.2f} {r['max_us']:>7.2f} {r['weight_mb']:>6.2f} "
                  f"{rate:>6.2f} {r['ready_us']:>9.1f} {r['after_us']:>9.1f} "
                  f"{r['work_us']:>8.2f} {r['per_program']:>8}")


if __name__ == "__main__":
    main()
