"""Worst per-seam errors of each kernel backend against the reference at the real geometry: what
tests/gpu/test_step_cases_gpu.py's bounds are set from (about 3x the worst printed here).

    PYTHONPATH=$PWD python benchmarks/seam_errors.py                      # GPU: tp 2, 4; M 1..48
    PYTHONPATH=$PWD python benchmarks/seam_errors.py --tokens 1 5 --json seam_errors.json

For each backend, tp share, layer kind (window only, compressed), token count and seed: one
step (tests/step_helpers.run_step) against the reference on the same inputs, every seam
measured with ``dsv41.parity.seam_errors``. Prints the worst max abs, relative L2 error and
least E8M0 code agreement per (backend, seam), where each came from, and ``3x`` bounds, over
all tokens and over all but the token farthest from the reference (by q): one token may carry a
quantization flip against the reference (tests/gpu/test_step_cases_gpu.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from step_helpers import drop_token, farthest_token, run_step, step_errors  # noqa: E402

from dsv41 import backends  # noqa: E402
from dsv41.common.geometry import Dims  # noqa: E402
from dsv41.common.scenario import make_scenario  # noqa: E402
from dsv41.common.weights import LayerWeights  # noqa: E402


def layer_ids(model: str) -> dict[str, int]:
    ratios = Dims.of(model, 1).model.compress_ratios
    return {"window": next(i for i, r in enumerate(ratios) if not r),
            "compressed": next(i for i, r in enumerate(ratios) if r)}  # fmt: skip


def measure(args) -> tuple[dict, list[dict]]:
    worst: dict[tuple[str, str], dict] = {}
    rows = []
    for tp in args.tp:
        for kind, layer_id in layer_ids(args.model).items():
            lw = LayerWeights(Dims.of(args.model, tp), tp - 1, layer_id, device=args.device)
            lw.dummy_load(seed=100 + tp + layer_id)
            for tokens in args.tokens:
                names = [n for n in args.backends
                         if backends.limits(n).refusal(tp, tokens) is None]  # fmt: skip
                for seed in range(args.seeds):
                    sc = make_scenario(lw.dims, layer_id, tokens, seed=1000 * seed + tokens,
                                       device=args.device)  # fmt: skip
                    ref = run_step("reference", lw, sc)
                    for name in names:
                        t0 = time.perf_counter()
                        got = run_step(name, lw, sc)
                        errors = step_errors(got, ref)
                        far = farthest_token(got, ref)
                        where = {"backend": name, "tp": tp, "layer": kind, "tokens": tokens,
                                 "seed": seed, "farthest": far}  # fmt: skip
                        rows.append({**where, "errors": errors})
                        scopes = [("all", errors)]
                        if tokens > 1:
                            rest = step_errors(drop_token(got, far), drop_token(ref, far))
                            scopes.append(("but one", rest))
                        for scope, errs in scopes:
                            for seam, e in errs.items():
                                w = worst.setdefault((name, seam, scope),
                                                     {"max_abs": 0.0, "rel_l2": 0.0,
                                                      "codes": None, "at": {}})  # fmt: skip
                                w["max_abs"] = max(w["max_abs"], e["max_abs"])
                                if e["rel_l2"] > w["rel_l2"]:
                                    w["rel_l2"], w["at"] = e["rel_l2"], where
                                if e["codes"] is not None:
                                    w["codes"] = min(e["codes"], w["codes"] or 1.0)
                        print(f"{name:<7} tp {tp} {kind:<10} M {tokens:>2} seed {seed}: "
                              f"y rel {errors['y']['rel_l2']:.2e} "
                              f"({time.perf_counter() - t0:.1f} s)", flush=True)  # fmt: skip
    return worst, rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="dsv41-flash")
    p.add_argument("--tp", type=int, nargs="+", default=[2, 4])
    p.add_argument("--tokens", type=int, nargs="+", default=list(range(1, 49)))
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--backends", nargs="+", default=list(backends.KERNEL_BACKENDS))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", help="write every step's errors and the worst ones here")
    args = p.parse_args()
    worst, rows = measure(args)
    print(f"\n{'backend':<8} {'seam':<7} {'tokens':<8} {'max abs':>10} {'rel L2':>10} "
          f"{'codes':>8}  3x bounds (rel L2, codes)   worst rel at")  # fmt: skip
    for (name, seam, scope), w in sorted(worst.items()):
        codes = "-" if w["codes"] is None else f"{w['codes']:.4f}"
        code_bound = "" if w["codes"] is None else f", {1 - 3 * (1 - w['codes']):.4f}"
        print(f"{name:<8} {seam:<7} {scope:<8} {w['max_abs']:>10.3e} {w['rel_l2']:>10.3e} "
              f"{codes:>8}  {3 * w['rel_l2']:.1e}{code_bound:<20} {w['at']}")  # fmt: skip
    if args.json:
        out = {"worst": [{"backend": n, "seam": s, "tokens": scope, **w}
                         for (n, s, scope), w in sorted(worst.items())],
               "steps": rows}  # fmt: skip
        Path(args.json).write_text(json.dumps(out, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
