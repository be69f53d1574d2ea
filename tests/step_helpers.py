"""One way for step tests to run a backend and measure it against another, seam by seam.

``run_step(name, layer, inputs)`` calls the registry's step (``dsv41.backends``) on private
copies of the caches and returns its seams in the reference's standard layout
(``dsv41.parity.standard_seams``; ``kv`` and ``lse`` passed through where a backend
returns them) with the window cache after the step. ``step_errors`` gives
``seam_errors`` for every seam both sides have; ``assert_within`` checks them against
per-seam bounds.
"""

from __future__ import annotations

import dataclasses

import torch

from dsv41 import backends
from dsv41.common.step_inputs import StepInputs
from dsv41.common.weights import LayerWeights
from dsv41.parity import seam_errors, standard_seams

EXACT = {"max_abs": 0.0, "rel_l2": 0.0, "codes": 1.0}  # a seam equal bit for bit (codes all equal)


@dataclasses.dataclass
class StepRun:
    seams: dict[str, object]  # standard layout: fp32 tensors, MX seams as (values fp32, codes)
    window: torch.Tensor  # the window cache's bytes after the step


def run_step(name: str, layer: LayerWeights, inputs: StepInputs, **kwargs) -> StepRun:
    """Backend ``name``'s step on copies of ``inputs``' caches; ``kwargs`` go to the step."""
    work = inputs.clone_caches()
    raw = backends.get(name).step(layer, work, **kwargs)
    seams = standard_seams(raw, layer, work.positions)
    for extra in ("kv", "lse"):
        if extra in raw:
            seams[extra] = raw[extra].float()
    return StepRun(seams, work.window_cache.data.clone())


def step_errors(got: StepRun, want: StepRun) -> dict[str, dict[str, float | None]]:
    """``seam_errors`` of every seam ``got`` and ``want`` both have, plus the window cache."""
    out = {name: seam_errors(got.seams[name], want.seams[name])
           for name in got.seams if name in want.seams}  # fmt: skip
    out["window"] = seam_errors(got.window.view(torch.uint8).int(),
                                want.window.view(torch.uint8).int())  # fmt: skip
    return out


def assert_within(errors: dict[str, dict], bounds: dict[str, dict]) -> None:
    """Every seam named in ``bounds``: max_abs and rel_l2 at most the bound, codes (MX seams)
    at least it."""
    bad = []
    for seam, bound in bounds.items():
        got = errors[seam]
        for key, limit in bound.items():
            value = got[key]
            if key == "codes" and value is None:  # not an MX seam: values only
                continue
            ok = value >= limit if key == "codes" else value <= limit
            if not ok:
                bad.append(f"{seam}.{key} = {value!r} (bound {limit!r})")
    assert not bad, "; ".join(bad) + f"\nall errors: {errors}"
