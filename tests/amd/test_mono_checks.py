"""amd/mono/checks.py: the metrics mono's tests and the CLI report, against their formulas on
random data (no kernel run)."""

from __future__ import annotations


import torch

from dsv41.amd.mono.checks import code_counts, fused_o_codes, parity, region_agreement
from dsv41.amd.mono.plan import Plan
from dsv41.common.fused_layout import permute_o_codes_from_fused
from dsv41.common.geometry import Dims
from dsv41.common.mx import mxfp8_quantize
from dsv41.common.reference import reference_step
from dsv41.common.scenario import make_scenario
from dsv41.common.weights import LayerWeights


def _reference(tp: int = 2, tokens: int = 3):
    lw = LayerWeights(Dims.of("tiny", tp), tp - 1, 1)
    lw.dummy_load(seed=12)
    return lw, reference_step(lw, make_scenario(lw.dims, 1, tokens, seed=5))


def _mono_like(dims: Dims, ref) -> dict:
    """The reference's seams as mono returns them (fused xo codes, z flat with its MXFP8)."""
    z = ref.z.reshape(ref.y.shape[0], dims.o_rows)
    return {"y": ref.y.clone(), "q": ref.q.clone(), "z": z.clone(), "z8": mxfp8_quantize(z),
            "xo": (None, fused_o_codes(ref.xo[1], dims.model.heads_per_group))}  # fmt: skip


def test_fused_o_codes_is_the_o_permutation():
    codes = torch.randint(0, 255, (2, 16, 16), dtype=torch.uint8)
    fused = fused_o_codes(codes, 8)
    assert torch.equal(permute_o_codes_from_fused(fused, 16, 8), codes)
    assert fused[0, 8 * 3 + 5] == codes[0, 5, 3]  # group 0: fused[c * G + h] = std[h, c]


def test_parity_of_equal_seams_and_of_a_perturbed_y():
    lw, ref = _reference()
    seams = _mono_like(lw.dims, ref)
    got = parity(lw.dims, seams, ref)
    assert got == {"y_rel": 0.0, "q_rel": 0.0, "z_rel": 0.0, "xo_codes": 1.0, "z_codes": 1.0}
    noise = torch.randn(ref.y.shape, generator=torch.Generator().manual_seed(1))
    seams["y"] = (ref.y.float() + 0.01 * noise).bfloat16()
    want = float((seams["y"].float() - ref.y.float()).norm() / ref.y.float().norm())
    assert abs(parity(lw.dims, seams, ref)["y_rel"] - want) <= 1e-6 * want and want > 1e-3


def test_code_counts_count_the_changed_codes():
    lw, ref = _reference()
    seams = _mono_like(lw.dims, ref)
    xo_codes = seams["xo"][1].clone()
    xo_codes[0, :5] += 1
    z8 = (seams["z8"][0], seams["z8"][1].clone())
    z8[1][1, 0] += 1
    seams = {**seams, "xo": (None, xo_codes), "z8": z8}
    counts = code_counts(lw.dims, seams, ref)
    assert counts["xo"] == (xo_codes.numel() - 5, xo_codes.numel())
    assert counts["z"] == (z8[1].numel() - 1, z8[1].numel())
    got = parity(lw.dims, seams, ref)
    assert got["xo_codes"] == (xo_codes.numel() - 5) / xo_codes.numel()


def test_region_agreement_finds_the_changed_region():
    plan = Plan(Dims.of("tiny", 2), 3)
    gen = torch.Generator().manual_seed(2)
    # bytes <= 100: no float in the scratch is a NaN (which would differ from itself)
    a = torch.randint(0, 100, (plan.scratch_bytes,), dtype=torch.uint8, generator=gen)
    b = a.clone()
    name = "z"
    region = plan.regions[name]
    view = region.view(b, plan.tokens)
    view.view(-1)[0] = view.view(-1)[0] + 1  # one element of z's live part
    got = region_agreement(plan, b, a)
    assert abs(got[name] - (1 - 1 / view.numel())) <= 1e-6  # a float32 mean
    assert all(v == 1.0 for k, v in got.items() if k != name)
