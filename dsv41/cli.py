"""The ``dsv41`` command: plan, reference, checkpoint.

``dsv41 plan`` prints a rank's geometry and task counts; ``dsv41 reference``
runs one reference step on random MXFP8 weights and prints each seam;
``dsv41 checkpoint synth|inspect`` writes and validates checkpoints.
"""

from __future__ import annotations

import argparse
import sys

import torch

from dsv41.config import ConfigError


def _geometry(args) -> "Dims":  # noqa: F821
    from dsv41.common.geometry import Dims

    return Dims.of(args.config, args.tp)


def cmd_plan(args) -> int:
    dims = _geometry(args)
    m = dims.model
    rows = [
        ("model", m.name), ("tp", dims.tp), ("tokens", args.tokens),
        ("heads", dims.heads), ("head_tiles", dims.head_tiles), ("groups", dims.groups),
        ("group_k", dims.group_k), ("q_rows", dims.q_rows), ("o_rows", dims.o_rows),
        ("wqb_tasks", dims.wqb_tasks), ("woa_tasks", dims.woa_tasks), ("wob_tasks", dims.wob_tasks),
        ("keys", m.keys),
    ]
    for rank in range(dims.tp):
        h, g = dims.head_range(rank), dims.group_range(rank)
        rows.append((f"rank {rank}", f"heads {h.start}..{h.stop - 1}, groups {g.start}..{g.stop - 1}"))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    return 0


def cmd_reference(args) -> int:
    from dsv41.common.reference import reference_step
    from dsv41.common.scenario import make_scenario
    from dsv41.common.weights import LayerWeights

    dims = _geometry(args)
    layer = LayerWeights(dims, args.rank, args.layer)
    layer.dummy_load(args.seed)
    sc = make_scenario(dims, args.layer, args.tokens, fmt=args.record_format, seed=args.seed)
    seams = reference_step(
        layer, sc.x, sc.positions, sc.slot_mapping, sc.key_table, sc.window_cache, sc.compressed_cache
    )
    print(f"reference step: {dims.model.name}, tp {dims.tp} rank {args.rank}, layer {args.layer}, "
          f"{args.tokens} tokens, {args.record_format}")
    print(f"{'seam':<10} {'dtype':<16} {'shape':<20} {'norm':>12}")
    for name, value in vars(seams).items():
        parts = value if isinstance(value, tuple) else (value,)
        for i, t in enumerate(parts):
            label = name if len(parts) == 1 else f"{name}.{('values', 'codes')[i]}"
            finite = t.float()[torch.isfinite(t.float())]
            print(f"{label:<10} {str(t.dtype).removeprefix('torch.'):<16} {str(list(t.shape)):<20} "
                  f"{finite.norm().item():>12.4f}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dsv41", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    def geometry_args(sp):
        sp.add_argument("--config", default="tiny", help="model config name or YAML path (default tiny)")
        sp.add_argument("--tp", type=int, default=1, help="tensor-parallel size: 1, 2, 4 or 8")
        sp.add_argument("--tokens", type=int, default=1, help="tokens in the step (M)")

    sp = sub.add_parser("plan", help="print a rank's geometry and task counts")
    geometry_args(sp)
    sp.set_defaults(func=cmd_plan)

    sp = sub.add_parser("reference", help="run one reference step on random MXFP8 weights")
    geometry_args(sp)
    sp.add_argument("--rank", type=int, default=0)
    sp.add_argument("--layer", type=int, default=1, help="layer id (decides RoPE and top-k)")
    sp.add_argument("--record-format", default="fp8_ds_mla", choices=["fp8_ds_mla", "fp8_mx"])
    sp.add_argument("--seed", type=int, default=0)
    sp.set_defaults(func=cmd_reference, tokens=4)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, ValueError) as e:
        print(f"dsv41 {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
