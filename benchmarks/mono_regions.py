"""Where a mono step departs from the reference: y, q, z per token count, and the kernel's
scratch against the schedule executor's, region by region (GPU; real geometry).

    python benchmarks/mono_regions.py --tp 2 --tokens 1-48 --regions 20
"""

from __future__ import annotations

import argparse

import torch

from dsv41.amd.mono.checks import parity, region_agreement
from dsv41.amd.mono.executor import ScheduleExecutor
from dsv41.amd.mono.launcher import MonoRunner, mono_step
from dsv41.bench import compressed_layer
from dsv41.common.reference import reference_step
from dsv41.common.scenario import make_scenario


def token_list(spec: str) -> list[int]:
    """``"1-48"`` or ``"1,7,20"`` -> token counts."""
    if "-" in spec:
        lo, hi = spec.split("-")
        return list(range(int(lo), int(hi) + 1))
    return [int(t) for t in spec.split(",") if t]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="dsv41-flash")
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--tokens", default="1-48", help="token counts for the parity rows")
    p.add_argument("--regions", default="20", help="token counts for the region diff")
    args = p.parse_args()
    dims, lw = compressed_layer(args.config, args.tp, seed=args.tp)
    lid = lw.layer_id
    print(f"{'S':>3} {'y_rel':>9} {'q_rel':>9} {'z_rel':>9} {'xo codes':>9} {'z codes':>9} "
          f"{'y_rel, private scratch':>22}")
    for s in token_list(args.tokens):
        sc = make_scenario(dims, lid, s, seed=s, device="cuda")
        ref = reference_step(lw, sc.clone_caches())
        got = parity(dims, mono_step(lw, sc.clone_caches()), ref)
        private = MonoRunner(lw, s)
        y = torch.empty_like(sc.x)
        private.launch(sc.clone_caches(), y)
        private.check()
        alone = parity(dims, private.seams(y), ref)
        print(f"{s:>3} {got['y_rel']:9.2e} {got['q_rel']:9.2e} {got['z_rel']:9.2e} "
              f"{got['xo_codes']:9.5f} {got['z_codes']:9.5f} {alone['y_rel']:22.2e}", flush=True)
    for s in token_list(args.regions):
        sc = make_scenario(dims, lid, s, seed=s, device="cuda")
        runner = MonoRunner(lw, s, epoch=3)
        y = torch.empty_like(sc.x)
        runner.launch(sc.clone_caches(), y)
        runner.check()
        scratch = runner.plan.new_scratch("cuda", epoch=3)
        y_exec = torch.empty_like(sc.x)
        executor = ScheduleExecutor(runner.plan, lw, runner.cos, runner.sin)
        executor.run(scratch, sc.clone_caches(), y_exec)
        agree = region_agreement(runner.plan, runner.scratch, scratch)
        y_same = float((y == y_exec).float().mean())
        print(f"S = {s}, private scratch: y equal {y_same:.4f}; "
              + " ".join(f"{k} {v:.4f}" for k, v in agree.items()), flush=True)


if __name__ == "__main__":
    main()
