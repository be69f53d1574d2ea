"""The ``dsv41`` command: parity, bench, plan, reference, checkpoint.

``dsv41 parity`` (the main job) runs the same weights and inputs through every
backend this machine has plus the reference and compares them seam by seam;
``dsv41 plan`` prints a rank's geometry and a backend's tuning; ``dsv41 reference``
runs one reference step and prints each seam; ``dsv41 checkpoint synth|inspect``
writes and validates checkpoints.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from dsv41.common import switches

if not torch.cuda.is_available():
    switches.use_interpreter_without_gpu()  # before triton decorates the kernels

from dsv41.argtypes import (
    HelpFormatter,
    backend_list,
    existing_dir,
    float_in,
    int_at_least,
    new_file,
)
from dsv41.common.geometry import TP_SIZES
from dsv41.config import ConfigError
from dsv41.parity import DEFAULT_CODE_AGREEMENT, DEFAULT_REL_TOL


def _geometry(args) -> Dims:  # noqa: F821
    from dsv41.common.geometry import Dims

    return Dims.of(args.config, args.tp)


def cmd_plan(args) -> int:
    dims = _geometry(args)
    m = dims.model
    rows = [
        ("model", m.name), ("tp", f"{dims.tp} ranks"),
        ("tokens", f"{args.tokens} tokens a step (M)"),
        ("heads", f"{dims.heads} query heads a rank"),
        ("head_tiles", f"{dims.head_tiles} tiles of up to 16 heads"),
        ("groups", f"{dims.groups} wo_a groups a rank"),
        ("group_k", f"{dims.group_k} inputs of one wo_a group (heads x head_dim)"),
        ("q_rows", f"{dims.q_rows} rows of the rank's wq_b"),
        ("o_rows", f"{dims.o_rows} rows of the rank's wo_a"),
        ("keys", f"{m.keys} keys a token at most (topk + window)"),
    ]  # fmt: skip
    for rank in range(dims.tp):
        h, g = dims.head_range(rank), dims.group_range(rank)
        rows.append((f"rank {rank}", f"heads {h.start}..{h.stop - 1}, groups {g.start}..{g.stop - 1}"))
    if args.backend == "nvidia":
        from dsv41.nvidia.tuning import tuning_for

        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        where = "this GPU" if device.type == "cuda" else "the CPU interpreter (no PDL, no L2)"
        rows.append(("nvidia", f"the step's launches as tuned for {where}"))
        rows += tuning_for(dims, device, args.tokens).rows()
    elif args.backend == "mono":
        from dsv41.amd.mono.plan import Plan

        plan = Plan(dims, args.tokens)
        rows.append(("mono", f"{plan.total_tasks} tasks in {len(plan.stages)} stages, "
                             f"scratch {plan.scratch_bytes} B"))  # fmt: skip
        rows += [(f"stage {st.name}", f"{st.tasks} tasks (tickets {st.first}..{st.end - 1})")
                 for st in plan.stages]  # fmt: skip
        rows += plan.tuning.rows()
        rows.append(("tiling", ", ".join(f"{k} {v}" for k, v in plan.tiling.items())))
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
    seams = reference_step(layer, sc)
    print(f"reference step: {dims.model.name}, tp {dims.tp} rank {args.rank}, layer {args.layer}, "
          f"{args.tokens} tokens, {args.record_format}")
    print(f"{'seam':<10} {'dtype':<16} {'shape':<20} {'L2 norm':>12}  (E8M0 codes: their range)")
    for name, value in vars(seams).items():
        parts = value if isinstance(value, tuple) else (value,)
        for i, t in enumerate(parts):
            label = name if len(parts) == 1 else f"{name}.{('values', 'codes')[i]}"
            if t.dtype.is_floating_point:
                finite = t.float()[torch.isfinite(t.float())]
                value = f"{finite.norm().item():>12.4f}"
            else:  # scale codes: a norm of exponents means nothing
                value = f"{'-':>12}  codes {t.min().item()}..{t.max().item()}"
            dtype = str(t.dtype).removeprefix("torch.")
            print(f"{label:<10} {dtype:<16} {list(t.shape)!s:<20} {value}")
    return 0


def cmd_parity(args) -> int:
    from dsv41.common.scenario import make_scenario
    from dsv41.common.weights import LayerWeights
    from dsv41 import backends as registry
    from dsv41.parity import format_table, run_parity

    if args.deploy:
        from dsv41.config import load_deploy_config

        deploy = load_deploy_config(args.deploy)
        args.config, args.tp, args.record_format = deploy.model, deploy.tp, deploy.record_format
        if args.tokens > deploy.max_tokens:
            raise ValueError(f"--tokens: expected at most the deployment's max_tokens "
                             f"{deploy.max_tokens}, got {args.tokens}")  # fmt: skip
        if deploy.backend != "auto" and not args.backends:
            args.backends = deploy.backend if deploy.backend != "reference" else None
    if args.checkpoint:
        from dsv41.common.checkpoint import checkpoint_model

        args.config = checkpoint_model(args.checkpoint, args.config)  # its config.json by default
    elif args.config is None:
        args.config = "tiny"
    dims = _geometry(args)
    if args.distributed:
        return _parity_distributed(args, dims)
    # Which backends run (or why not), before any weight is made.
    fmt = args.record_format
    names = ["reference"] + registry.available(dims.tp, args.tokens, args.backends, fmt)
    refused = registry.refusals(dims.tp, args.tokens, fmt)
    left_out = {n: f"{refused[n]} ({n}'s limits: {registry.limits(n).describe()})"
                if n in refused else "not in --backends"
                for n in registry.KERNEL_BACKENDS if n not in names}  # fmt: skip
    device = "cuda" if torch.cuda.is_available() else "cpu"
    layer = LayerWeights(dims, args.rank, args.layer, device=device)
    if args.checkpoint:
        from dsv41.common.checkpoint import load_layer

        load_layer(args.checkpoint, layer)
        skipped = f", {len(layer.last_skipped)} compressor/indexer tensors skipped" if layer.last_skipped else ""
        source = f"checkpoint {args.checkpoint}{skipped}"
    else:
        layer.dummy_load(args.seed)
        source = f"synthetic weights (seed {args.seed})"
    sc = make_scenario(dims, args.layer, args.tokens, fmt=args.record_format, seed=args.seed, device=device)
    backends = {n: registry.get(n).step for n in names}
    where = device if device == "cuda" else "cpu, Triton interpreter"
    print(f"parity: {dims.model.name}, tp {dims.tp} rank {args.rank}, layer {args.layer}, "
          f"{args.tokens} tokens, {args.record_format}, {source}, on {where}")
    for n, why in left_out.items():
        print(f"skipped {n}: {why}")
    comparisons = run_parity(layer, sc, backends, rel_tol=args.rel_tol, code_agreement=args.code_agreement)
    print(format_table(comparisons))
    failed = sorted({c.seam for c in comparisons if not c.ok})
    if args.json:
        report = {
            "verdict": "failed" if failed else "ok", "failed_seams": failed,
            "config": dims.model.name, "tp": dims.tp, "rank": args.rank, "layer": args.layer,
            "tokens": args.tokens, "record_format": args.record_format, "seed": args.seed,
            "checkpoint": str(args.checkpoint) if args.checkpoint else None,
            "deploy": args.deploy, "device": where, "rel_tol": args.rel_tol,
            "code_agreement": args.code_agreement, "compared": names, "skipped": left_out,
            "comparisons": [c.as_dict() for c in comparisons],
        }  # fmt: skip
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    if failed:
        print(f"parity FAILED on seams: {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"parity ok: {len(comparisons)} comparisons within rel L2 <= {args.rel_tol:g}, "
          f"codes >= {100 * args.code_agreement:g}%")
    return 0


def _parity_distributed(args, dims) -> int:
    """``parity --distributed`` (one process a rank, under torchrun): every backend's step with the
    deterministic reduce vs the single-process sum of its partials and the reference's."""
    import torch.distributed as dist

    from dsv41 import backends as registry
    from dsv41 import distributed

    created = not dist.is_initialized()
    device = distributed.init()
    try:
        world, rank = dist.get_world_size(), dist.get_rank()
        if world != dims.tp:
            raise ValueError(f"--tp: expected the number of processes torchrun started ({world}), "
                             f"got {dims.tp}")  # fmt: skip
        wanted = [n.strip() for n in (args.backends or "").split(",") if n.strip()]
        kernels = ",".join(n for n in wanted if n != "reference")  # --backends reference: it alone
        names = ["reference"] + (registry.available(dims.tp, args.tokens, kernels)
                                 if kernels or not wanted else [])  # fmt: skip
        if rank == 0:
            source = (f"checkpoint {args.checkpoint}" if args.checkpoint
                      else f"synthetic weights (seed {args.seed})")  # fmt: skip
            print(f"parity --distributed: {dims.model.name}, tp {dims.tp} ({dist.get_backend()}), "
                  f"layer {args.layer}, {args.tokens} tokens, {args.record_format}, {source}, "
                  f"on {device}")  # fmt: skip
        results = distributed.distributed_parity(
            dims.model, args.layer, args.tokens, names, record_format=args.record_format,
            seed=args.seed, checkpoint=args.checkpoint, rel_tol=args.rel_tol, device=device,
        )  # fmt: skip
        failed = torch.tensor([int(not all(r.ok for r in results))], device=device)
        dist.broadcast(failed, src=0)
        if rank == 0:
            print(distributed.format_results(results))
            if args.json:
                with open(args.json, "w") as f:
                    json.dump({"config": dims.model.name, "tp": dims.tp, "tokens": args.tokens,
                               "record_format": args.record_format, "rel_tol": args.rel_tol,
                               "distributed": [vars(r) for r in results]}, f, indent=1)
            if failed.item():
                bad = ", ".join(r.backend for r in results if not r.ok)
                print(f"parity --distributed FAILED: {bad}", file=sys.stderr)
            else:
                print(f"parity --distributed ok: {len(results)} backends equal to their "
                      f"single-process sums bit for bit, within rel L2 <= {args.rel_tol:g} of "
                      f"the reference")  # fmt: skip
        return int(failed.item())
    finally:
        if created:
            dist.destroy_process_group()


def cmd_checkpoint_synth(args) -> int:
    from dsv41.common.checkpoint import synth_checkpoint

    config = args.config or args.like or "tiny"
    if args.force:  # the old checkpoint's files go, so no stale shard outlives the new index
        from dsv41.common.checkpoint import INDEX_FILE
        from dsv41.config import HF_CONFIG

        out = Path(args.out)
        for old in [*out.glob("*.safetensors"), out / INDEX_FILE, out / HF_CONFIG]:
            old.unlink(missing_ok=True)
    index = synth_checkpoint(config, args.layers, args.out, shards=args.shards, seed=args.seed,
                             mtp=args.mtp, like=args.like, others=args.others)
    layout = f", {args.like} layout" if args.like else ""
    print(f"wrote {args.layers} layer(s) + {args.mtp} MTP layer(s) of {config}{layout} "
          f"in {args.shards} shard(s): {index}")
    return 0


def cmd_checkpoint_inspect(args) -> int:
    from pathlib import Path

    from dsv41.common.checkpoint import format_table, inspect_checkpoint
    from dsv41.config import HF_CONFIG, read_hf_config

    rows = inspect_checkpoint(args.dir, args.config)
    print(format_table(rows))
    if args.config is None and (Path(args.dir) / HF_CONFIG).is_file():
        m, unmapped = read_hf_config(args.dir)
        print(f"model from {HF_CONFIG}: {m.num_layers} layers + {m.mtp_layers} MTP, hidden {m.hidden}, "
              f"scale blocks {m.weight_block[0]} x {m.weight_block[1]}; fields not mapped "
              f"(not the attention step's): {', '.join(unmapped) or 'none'}")
    print(f"{args.dir}: {len(rows)} tensors, all valid")
    return 0


def build_parser() -> argparse.ArgumentParser:
    fmt = HelpFormatter  # every option's help shows its default
    p = argparse.ArgumentParser(prog="dsv41", description=__doc__.split("\n\n")[0],
                                formatter_class=fmt)  # fmt: skip
    sub = p.add_subparsers(dest="command", required=True)

    def parser(parent, name, **kw):
        sp = parent.add_parser(name, formatter_class=fmt, **kw)
        sp.set_defaults(parser=sp)
        return sp

    def geometry_args(sp):
        sp.add_argument("--config", default="tiny",
                        help="model config name, YAML path or model directory")
        sp.add_argument("--tp", type=int, choices=TP_SIZES, default=1, help="tensor-parallel size")
        sp.add_argument("--tokens", type=int_at_least(1), default=1, help="tokens in the step (M)")

    def step_args(sp):
        sp.add_argument("--rank", type=int_at_least(0), default=0, help="TP rank (below --tp)")
        sp.add_argument("--layer", type=int_at_least(0), default=1,
                        help="layer id (decides RoPE and top-k)")
        sp.add_argument("--record-format", default="fp8_ds_mla", choices=["fp8_ds_mla", "fp8_mx"],
                        help="KV cache record format")
        sp.add_argument("--seed", type=int_at_least(0), default=0,
                        help="seed of the weights and inputs")

    sp = parser(sub, "parity",
                help="compare every available backend with the reference, seam by seam")
    geometry_args(sp)
    step_args(sp)
    sp.add_argument("--deploy", help="deployment config (dsv41/configs/deploy/NAME.yaml): sets config, "
                    "tp, record format and the backend compared (unless --backends); --tokens "
                    "at most its max_tokens")
    sp.add_argument("--checkpoint", type=existing_dir,
                    help="checkpoint or downloaded model directory (default: synthetic weights); "
                    "its config.json is the model unless --config is given")
    sp.add_argument("--backends", type=backend_list,
                    help="comma-separated kernel backends to compare (default: all that can run)")
    sp.add_argument("--rel-tol", type=float_in(0, low_open=True), default=DEFAULT_REL_TOL,
                    help="max relative L2 error a seam")
    sp.add_argument("--code-agreement", type=float_in(0, 1), default=DEFAULT_CODE_AGREEMENT,
                    help="min fraction of equal E8M0 codes in MX seams")
    sp.add_argument("--json", type=new_file,
                    help="write the verdict, the inputs and the comparisons to this JSON file")
    sp.add_argument("--distributed", action="store_true",
                    help="one process a rank (torchrun --nproc-per-node TP): each backend's step "
                    "with the deterministic reduce vs the single-process sum of its partials (bit "
                    "for bit) and the reference's (--rel-tol); --backends may be just reference; "
                    "--rank is ignored")
    sp.set_defaults(func=cmd_parity, tp=2, tokens=4, config=None)

    sub.add_parser("bench", add_help=False,
                   help="us per layer step of backends vs the floor and the reference (GPU); "
                        "dsv41 bench --help for its options")  # fmt: skip

    sp = parser(sub, "plan", help="print a rank's geometry and a backend's launch choices")
    geometry_args(sp)
    sp.add_argument("--backend", choices=["nvidia", "mono"],
                    help="also print this backend's tuning (mono: its stages and task counts)")
    sp.set_defaults(func=cmd_plan)

    ck = sub.add_parser("checkpoint", help="write or validate checkpoints").add_subparsers(
        dest="checkpoint_command", required=True
    )
    sp = parser(ck, "synth",
                help="write a synthetic checkpoint with the real names, dtypes and shapes")
    sp.add_argument("--config", help="model config name, YAML path or model directory (default: "
                    "--like's model, else tiny)")
    sp.add_argument("--like", choices=["dsv41-flash", "dsv4-flash"],
                    help="write the released layout: that model's config.json form and scale blocks")
    sp.add_argument("--layers", type=int_at_least(0), default=1, help="layers 0 .. L-1 to write")
    sp.add_argument("--mtp", type=int_at_least(0), default=0,
                    help="MTP layers mtp.0 .. mtp.N-1 to write")
    sp.add_argument("--others", action="store_true",
                    help="also write stand-ins for the rest of the model (compressor, indexer, norms, ...)")
    sp.add_argument("--out", required=True, help="output directory (new, empty, or --force)")
    sp.add_argument("--force", action="store_true",
                    help="replace the checkpoint in --out (its shards, index and config.json)")
    sp.add_argument("--shards", type=int_at_least(1), default=4,
                    help="safetensors files to spread the tensors over")
    sp.add_argument("--seed", type=int_at_least(0), default=0, help="seed of the weights")
    sp.set_defaults(func=cmd_checkpoint_synth)
    sp = parser(ck, "inspect",
                help="validate a checkpoint against a model config; print its tensors")
    sp.add_argument("dir", type=existing_dir,
                    help="checkpoint directory (safetensors files + index JSON)")
    sp.add_argument("--config", help="model config (default: the directory's config.json, else the "
                    "one recorded in the index)")
    sp.set_defaults(func=cmd_checkpoint_inspect)

    sp = parser(sub, "reference", help="run one reference step on random MXFP8 weights")
    geometry_args(sp)
    step_args(sp)
    sp.set_defaults(func=cmd_reference, tokens=4)
    return p


def check_args(args: argparse.Namespace) -> None:
    """The checks that take two arguments, in argparse's error form (exit 2)."""
    fail = args.parser.error
    backends = (getattr(args, "backends", None) or "").split(",")
    if "reference" in backends and not getattr(args, "distributed", False):
        fail(f"argument --backends: expected kernel backends (the reference is always compared), "
             f"got {args.backends!r}")  # fmt: skip
    if getattr(args, "rank", None) is not None and getattr(args, "deploy", None) is None:
        if args.rank >= args.tp:
            fail(f"argument --rank: expected 0 <= rank < --tp = {args.tp}, got {args.rank}")
    if getattr(args, "out", None) is not None:
        from dsv41.common.checkpoint import INDEX_FILE, SINGLE_FILE
        from dsv41.config import HF_CONFIG

        out = Path(args.out)
        if out.exists() and not out.is_dir():
            fail(f"argument --out: expected a directory, got an existing file: {out}")
        held = [n for n in (INDEX_FILE, SINGLE_FILE, HF_CONFIG) if (out / n).exists()]
        held += sorted(p.name for p in out.glob("*.safetensors") if p.name != SINGLE_FILE)
        if held and not args.force:
            fail(f"argument --out: {out} already holds a checkpoint ({', '.join(held[:3])}"
                 f"{', ...' if len(held) > 3 else ''}); pass --force to replace it")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:  # its own parser: dsv41.bench
        from dsv41.bench import main as bench_main

        return bench_main(argv[1:])
    args = build_parser().parse_args(argv)
    check_args(args)
    try:
        return args.func(args)
    except (ConfigError, ValueError, OSError) as e:
        print(f"dsv41 {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
