"""Cross-backend parity: the same weights and inputs through every backend, seam by seam.

Each backend's seams are brought to the reference's standard layout first
(``q`` un-fused and RoPE'd, ``xo`` values and codes un-fused, ``z`` flat), then
every pair is compared on each seam (x8, qkv, q, xo, z, y): max abs error,
relative L2 error, cosine, and for MXFP8 seams the fraction of E8M0 codes that
agree. A pair fails when a seam's relative error is over ``rel_tol`` or its code
agreement is under ``code_agreement``.

Bad values are part of parity (docs/bad_inputs.md): the ``y nan`` seam runs the step's
first token again with a NaN in its x through every backend and compares the y rows, NaN
for NaN, the rest by value (the contract's answer is a NaN row in every backend).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable

import torch

from dsv41.common.fused_layout import (
    permute_o_codes_from_fused,
    permute_o_from_fused,
    permute_q_from_fused,
)
from dsv41.common.mx import mxfp8_dequantize
from dsv41.common.rope import apply_rope, rope_tables
from dsv41.common.scenario import Scenario
from dsv41.common.step_inputs import StepInputs
from dsv41.common.weights import LayerWeights

SEAMS = ("x8", "qkv", "q", "xo", "z", "y")
MX_SEAMS = ("x8", "xo")  # seams that are (values, codes)
DEFAULT_REL_TOL = 1e-2  # relative L2 error of a seam (issues #4 / #5: y <= 1e-2)
DEFAULT_CODE_AGREEMENT = 0.999  # E8M0 codes equal in >= 99.9 % of groups


@dataclasses.dataclass
class Comparison:
    seam: str
    pair: tuple[str, str]
    max_abs: float
    rel_l2: float
    cosine: float
    code_agreement: float | None  # MX seams only
    ok: bool

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "pair": list(self.pair)}


def standard_seams(seams: dict, layer: LayerWeights, positions: torch.Tensor) -> dict[str, object]:
    """A backend's seams in the reference's layout: fp32 tensors, MX seams as (values fp32, codes)."""
    dims, m = layer.dims, layer.dims.model
    out: dict[str, object] = {}
    if "x8" in seams:
        values, codes = seams["x8"]
        out["x8"] = (mxfp8_dequantize(values, codes), codes)
    for name in ("qkv", "y"):
        if name in seams:
            out[name] = seams[name].float()
    if "q" in seams:
        q = seams["q"]
        if q.dim() == 2:  # fused, straight out of the wq_b GEMM: un-fuse and RoPE as the reference does
            cos, sin = rope_tables(m, layer.layer_id, q.device)
            q = apply_rope(permute_q_from_fused(q, dims.heads, m.head_dim), positions, cos, sin, m.nope_dim)
        out["q"] = q.float()
    if "xo" in seams:
        values, codes = seams["xo"]
        if values.dim() == 2:  # fused O layout
            values = permute_o_from_fused(values.float(), dims.heads, m.heads_per_group)
            codes = permute_o_codes_from_fused(codes, dims.heads, m.heads_per_group)
        out["xo"] = (mxfp8_dequantize(values, codes), codes)
    if "z" in seams:
        out["z"] = seams["z"].float().reshape(seams["z"].shape[0], -1)
    return out


def seam_errors(a: object, b: object) -> dict[str, float | None]:
    """Errors of seam ``a`` (tested) against ``b`` (baseline), both in the standard layout:
    ``max_abs``, ``rel_l2`` (``|a - b| / |b|``, 0 when both are 0), ``codes`` (the fraction
    of equal E8M0 codes for an MX seam given as (values, codes), else None). Positions where
    both are the same infinity count as equal; a NaN or a lone infinity in ``a`` gives inf."""
    codes = None
    if isinstance(a, tuple):
        codes = (a[1].cpu() == b[1].cpu()).float().mean().item() if b[1].numel() else 1.0
        a, b = a[0], b[0]
    a, b = a.double().cpu().flatten(), b.double().cpu().flatten()
    same = ((a == b) & torch.isinf(b)) | (torch.isnan(a) & torch.isnan(b))
    a, b = torch.where(same, 0.0, a), torch.where(same, 0.0, b)
    diff = a - b
    if not bool(torch.isfinite(diff).all()):
        return {"max_abs": float("inf"), "rel_l2": float("inf"), "codes": codes}
    max_abs = diff.abs().max().item() if diff.numel() else 0.0
    den, num = b.norm().item(), diff.norm().item()
    return {"max_abs": max_abs, "rel_l2": num / den if den > 0 else num, "codes": codes}


def compare(
    seam: str, pair: tuple[str, str], a: object, b: object, rel_tol: float, code_agreement: float
) -> Comparison:
    """Metrics of ``a`` (tested) against ``b`` (baseline) on one seam."""
    errors = seam_errors(a, b)
    agree = errors["codes"]
    if isinstance(a, tuple):
        a, b = a[0], b[0]
    a, b = a.double().cpu().flatten(), b.double().cpu().flatten()
    diff = a - b
    max_abs = diff.abs().max().item() if diff.numel() else 0.0
    rel = (diff.norm() / b.norm().clamp_min(1e-30)).item()
    cos = torch.nn.functional.cosine_similarity(a, b, dim=0).item()
    finite = bool(torch.isfinite(a).all())
    ok = finite and rel <= rel_tol and (agree is None or agree >= code_agreement)
    return Comparison(seam, pair, max_abs, rel, cos, agree, ok)


StepFn = Callable[[LayerWeights, StepInputs], dict]


def run_parity(
    layer: LayerWeights,
    scenario: Scenario,
    backends: dict[str, StepFn],
    *,
    rel_tol: float = DEFAULT_REL_TOL,
    code_agreement: float = DEFAULT_CODE_AGREEMENT,
    bad_values: bool = True,
) -> list[Comparison]:
    """Run every backend on its own copy of the caches and compare each pair on each seam
    (``bad_values``: and on the ``y nan`` seam).

    ``backends`` maps a name to a step function ``step(layer, inputs)`` returning a dict of
    seams (``dsv41.backends.get(name).step``); the first entry is the
    baseline each other is compared with first.
    """
    results: dict[str, dict[str, object]] = {}
    for name, step in backends.items():
        sc = scenario.clone_caches()
        seams = step(layer, sc)
        results[name] = standard_seams(seams, layer, sc.positions)
    comparisons = []
    for base, tested in itertools.combinations(results, 2):
        for seam in SEAMS:
            if seam in results[base] and seam in results[tested]:
                comparisons.append(
                    compare(seam, (tested, base), results[tested][seam], results[base][seam], rel_tol, code_agreement)
                )
    if bad_values:
        comparisons += nan_parity(layer, scenario, backends, rel_tol)
    return comparisons


def nan_step(scenario: StepInputs) -> StepInputs:
    """The scenario's first token alone, a NaN in its x (its caches copied)."""
    x = scenario.x[:1].clone()
    x[0, 0] = float("nan")
    one = StepInputs(x, scenario.positions[:1], scenario.slot_mapping[:1], scenario.key_table[:1],
                     scenario.window_cache, scenario.compressed_cache)  # fmt: skip
    return one.clone_caches()


def nan_parity(
    layer: LayerWeights, scenario: StepInputs, backends: dict[str, StepFn], rel_tol: float
) -> list[Comparison]:
    """The ``y nan`` seam of every pair: y of ``nan_step`` the same in each backend (NaN where
    the baseline has NaN, equal values elsewhere)."""
    ys = {name: step(layer, nan_step(scenario))["y"].float().cpu() for name, step in backends.items()}
    out = []
    for base, tested in itertools.combinations(ys, 2):
        a, b = ys[tested], ys[base]
        c = compare("y nan", (tested, base), a.nan_to_num(0.0), b.nan_to_num(0.0), rel_tol, 0.0)
        c.ok = c.ok and torch.equal(a.isnan(), b.isnan())
        out.append(c)
    return out


def format_table(comparisons: list[Comparison]) -> str:
    head = f"{'seam':<5} {'pair':<24} {'max abs':>10} {'rel L2':>10} {'cosine':>9} {'codes':>8}  status"
    lines = [head, "-" * len(head)]
    for c in comparisons:
        codes = "-" if c.code_agreement is None else f"{100 * c.code_agreement:.2f}%"
        lines.append(
            f"{c.seam:<5} {c.pair[0] + ' vs ' + c.pair[1]:<24} {c.max_abs:>10.3e} {c.rel_l2:>10.3e} "
            f"{c.cosine:>9.6f} {codes:>8}  {'ok' if c.ok else 'FAIL'}"
        )
    return "\n".join(lines)
