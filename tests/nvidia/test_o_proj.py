"""o_proj of a standard-layout bf16 o: fused WO-A and grouped paths vs the reference
(docs/design.md §2.6-8).

The reference is ``reference_step``'s tail written out: ``bf16(inverse_rope(o))``,
MXFP8 per 32 dims of a head, the O permutation, per-group ``wo_a``, bf16, MXFP8,
``wo_b``.
"""

import pytest
import torch

from dsv41.common.fused_layout import permute_o_to_fused
from dsv41.common.geometry import Dims
from dsv41.common.mx import mxfp8_dequantize, mxfp8_quantize
from dsv41.common.reference import mx_linear, wo_a_grouped
from dsv41.common.rope import apply_inverse_rope, rope_tables
from dsv41.common.weights import LayerWeights
from dsv41.nvidia.ops.o_cast import o_cast
from dsv41.nvidia.ops.o_proj import can_fuse_wo_a, o_proj, wo_a_from_o


@pytest.fixture(scope="module")
def layer() -> LayerWeights:
    lw = LayerWeights(Dims.of("tiny", 2), rank=1, layer_id=2)  # a compressed (YaRN) layer
    lw.dummy_load(seed=11)
    return lw


def inputs(layer: LayerWeights, m: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    o = torch.randn(m, layer.dims.heads, layer.dims.model.head_dim, generator=gen).bfloat16()
    return o, torch.randint(0, layer.dims.model.max_position, (m,), generator=gen)


def reference(layer: LayerWeights, o: torch.Tensor, positions: torch.Tensor):
    """``(xo standard (values, codes), z bf16 [M, o_rows], y bf16)``."""
    dims, model = layer.dims, layer.dims.model
    m = o.shape[0]
    cos, sin = rope_tables(model, layer.layer_id)
    xo = mxfp8_quantize(apply_inverse_rope(o, positions, cos, sin, model.nope_dim))
    a = permute_o_to_fused(mxfp8_dequantize(*xo), model.heads_per_group).flatten(-2)
    z = wo_a_grouped(layer, a).reshape(m, dims.o_rows)
    return xo, z, mx_linear(mxfp8_quantize(z), layer.wo_b, layer.wo_b_scale)


def assert_seam(got: torch.Tensor, want: torch.Tensor) -> None:
    """Bit-equal but for a rounding that fp32 accumulation order flips."""
    diff = (got.float() - want.float()).abs()
    assert (diff <= 2.0**-7 * want.float().abs() + 1e-6).all()
    assert (diff == 0).float().mean() >= 0.99


@pytest.mark.parametrize("m,fused", [(1, True), (5, True), (5, False), (33, False)])
def test_wo_a_paths_match_the_reference(layer, m, fused):
    o, positions = inputs(layer, m, m)
    _, want_z, _ = reference(layer, o, positions)
    z, z8 = wo_a_from_o(layer, o, positions, fused=fused)
    assert_seam(z, want_z)
    assert torch.equal(z8[1], mxfp8_quantize(z)[1])


def test_o_proj_both_paths(layer):
    """o_proj dispatches on can_fuse_wo_a; y matches the reference on either side of the bound."""
    for m in (3, 34):
        o, positions = inputs(layer, m, 100 + m)
        assert_seam(o_proj(layer, o, positions), reference(layer, o, positions)[2])


def test_o_cast_is_the_fused_xo(layer):
    """The grouped path's cast writes the reference's xo values and codes in the fused O layout."""
    o, positions = inputs(layer, 4, 5)
    xo_std, _, _ = reference(layer, o, positions)
    model = layer.dims.model
    cos, sin = rope_tables(model, layer.layer_id)
    values, codes = o_cast(
        o, positions, cos, sin, nope=model.nope_dim, heads_per_group=model.heads_per_group
    )
    want = permute_o_to_fused(xo_std[0].view(torch.uint8), model.heads_per_group).flatten(-2)
    codes32 = xo_std[1].repeat_interleave(32, dim=-1)
    want_codes = permute_o_to_fused(codes32, model.heads_per_group).flatten(-2)[:, ::32]
    assert torch.equal(codes, want_codes)
    got_v, want_v = values.float(), want.view(values.dtype).float()
    assert ((got_v - want_v).abs() <= 2.0**-3 * want_v.abs()).all()


def test_can_fuse_wo_a_bounds(layer):
    assert [can_fuse_wo_a(layer, m) for m in (0, 1, 32, 33)] == [False, True, True, False]
    o, positions = inputs(layer, 33, 0)
    with pytest.raises(ValueError, match="fused"):
        wo_a_from_o(layer, o, positions, fused=True)
    with pytest.raises(ValueError, match="o: expected bfloat16"):
        o_proj(layer, o.float(), positions)
