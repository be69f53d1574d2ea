"""How far a mono step is from the reference: the metrics the tests and the CLI's parity report.

``parity(dims, seams, ref)`` compares ``mono_step``'s seams (module docstring of
``launcher.py``) with ``reference_step``'s: ``y_rel = |y - y_ref| / |y_ref|``
(Frobenius), ``q_rel`` and ``z_rel`` likewise, and the fraction of E8M0 codes
that agree for xo (per 32 dims of a head, the reference's codes brought into
the fused order) and for z's MXFP8 (per 32 of o_rows); ``code_counts`` gives those
agreements as counts, to pool over steps.
``region_agreement`` diffs two scratches of one plan (kernel against schedule
executor) region by region.
"""

from __future__ import annotations

import torch

from dsv41.amd.mono.plan import Plan
from dsv41.common.geometry import Dims
from dsv41.common.mx import mxfp8_quantize
from dsv41.common.reference import Seams


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """``|a - b| / |b|``, 0 when both are 0."""
    den = b.float().norm()
    num = (a.float() - b.float()).norm()
    return float(num / den) if den > 0 else float(num)


def fused_o_codes(codes: torch.Tensor, heads_per_group: int) -> torch.Tensor:
    """Standard xo codes ``[M, heads, 16]`` -> fused ``[M, heads * 16]``:
    ``fused[g, c * G + h] = std[g * G + h, c]``."""
    m, heads, chunks = codes.shape
    groups = heads // heads_per_group
    return codes.view(m, groups, heads_per_group, chunks).transpose(2, 3).reshape(m, -1)


def code_counts(dims: Dims, seams: dict, ref: Seams) -> dict[str, tuple[int, int]]:
    """``{"xo": (equal, total), "z": (equal, total)}``: E8M0 codes of mono's xo and z8 that
    equal the reference's (so tests can pool them over steps)."""
    tokens = ref.y.shape[0]
    z = ref.z.reshape(tokens, dims.o_rows)
    pairs = {
        "xo": (seams["xo"][1], fused_o_codes(ref.xo[1], dims.model.heads_per_group)),
        "z": (seams["z8"][1], mxfp8_quantize(z)[1]),
    }
    return {k: (int((a.cpu() == b.cpu()).sum()), b.numel()) for k, (a, b) in pairs.items()}


def parity(dims: Dims, seams: dict, ref: Seams) -> dict[str, float]:
    """``{"y_rel", "q_rel", "z_rel", "xo_codes", "z_codes"}`` of mono seams against reference."""
    z = ref.z.reshape(ref.y.shape[0], dims.o_rows)
    out = {
        "y_rel": _rel(seams["y"], ref.y),
        "q_rel": _rel(seams["q"], ref.q),
        "z_rel": _rel(seams["z"], z),
    }
    for name, (same, total) in code_counts(dims, seams, ref).items():
        out[f"{name}_codes"] = same / total
    return out


def region_agreement(plan: Plan, got: torch.Tensor, want: torch.Tensor) -> dict[str, float]:
    """Fraction of equal elements in each region's live part (``-inf == -inf``; fp8 by value)."""
    out = {}
    for name, region in plan.regions.items():
        a, b = region.view(got, plan.tokens), region.view(want, plan.tokens)
        if a.dtype == torch.float8_e4m3fn:
            a, b = a.float(), b.float()
        out[name] = float((a == b).float().mean().cpu())
    return out
