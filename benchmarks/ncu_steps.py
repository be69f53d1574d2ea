"""A few eager layer steps of one backend, for a hardware-counter profiler to pick kernels from.

    ncu --clock-control none -k regex:mono_kernel --launch-skip 3 --launch-count 1 \\
        --metrics gpu__time_duration.sum,... python3 benchmarks/ncu_steps.py --backend mono

``gpu_session.sh ncu`` runs it under ``ncu`` for mono's kernel and nvidia's GEMMs at M = 1.
"""

from __future__ import annotations

import argparse

import torch

from dsv41.bench import compressed_layer, step_function
from dsv41.common.scenario import make_scenario


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="mono", choices=["nvidia", "mono"])
    p.add_argument("--config", default="dsv41-flash")
    p.add_argument("--tp", type=int, default=4)
    p.add_argument("--tokens", type=int, default=1)
    p.add_argument("--steps", type=int, default=5)
    args = p.parse_args()
    dims, layer = compressed_layer(args.config, args.tp, seed=1)
    sc = make_scenario(dims, layer.layer_id, args.tokens, seed=args.tokens, device="cuda")
    step = step_function(args.backend)
    if isinstance(step, str):
        raise SystemExit(step)
    for _ in range(args.steps):
        step(layer, sc.clone_caches())
    torch.cuda.synchronize()
    print(f"{args.steps} {args.backend} steps of {args.tokens} tokens at tp {args.tp}")


if __name__ == "__main__":
    main()
