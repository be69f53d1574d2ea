"""Fused Q / O layouts (docs/design.md §5): the permutations, their use on weights, and
permute_on_load."""

from __future__ import annotations

import pytest
import torch

from dsv41.common import fused_layout
from dsv41.common.fused_layout import (
    inverse_permutation,
    o_fused_chunk_permutation,
    o_fused_permutation,
    permute,
    permute_o_from_fused,
    permute_o_to_fused,
    permute_on_load,
    permute_q_from_fused,
    permute_q_to_fused,
    q_fused_permutation,
)
from dsv41.common.geometry import Dims
from dsv41.common.mx import E4M3, mxfp8_dequantize, mxfp8_quantize, quantize_weight_blocks
from dsv41.common.weights import LayerWeights, synth_layer_tensors

D = 512  # head_dim
G = 8  # heads a wo_a group


def _q_formula(num_heads: int, head_dim: int) -> torch.Tensor:
    """docs/design.md §5 loop: fused[(d // 16) * (H * 16) + h * 16 + d % 16] = standard[h * D +
    d]."""
    perm = [None] * (num_heads * head_dim)
    for h in range(num_heads):
        for d in range(head_dim):
            perm[(d // 16) * (num_heads * 16) + h * 16 + d % 16] = h * head_dim + d
    return torch.tensor(perm)


def _o_formula(heads: int, head_dim: int) -> torch.Tensor:
    """docs/design.md §5 loop: fused[(c * G + h) * 32 + j] = standard[h * D + c * 32 + j]."""
    perm = [None] * (heads * head_dim)
    for h in range(heads):
        for c in range(head_dim // 32):
            for j in range(32):
                perm[(c * heads + h) * 32 + j] = h * head_dim + c * 32 + j
    return torch.tensor(perm)


@pytest.mark.parametrize("num_heads", [4, 8, 16])
def test_q_permutation_formula(num_heads: int) -> None:
    perm = q_fused_permutation(num_heads, D)
    assert perm.dtype == torch.int64
    assert torch.equal(perm.sort().values, torch.arange(num_heads * D))  # bijective
    assert torch.equal(perm, _q_formula(num_heads, D))


def test_o_permutation_formula() -> None:
    perm = o_fused_permutation(G, D)
    assert torch.equal(perm.sort().values, torch.arange(G * D))
    assert torch.equal(perm, _o_formula(G, D))


def test_bad_head_dim() -> None:
    with pytest.raises(ValueError, match="head_dim: expected a multiple of 16, got 40"):
        q_fused_permutation(2, 40)
    with pytest.raises(ValueError, match="head_dim: expected a multiple of 32, got 48"):
        o_fused_permutation(2, 48)
    with pytest.raises(ValueError, match="o: expected heads a multiple of 8, got 12"):
        permute_o_to_fused(torch.zeros(1, 12, D), G)


def test_inverses_undo() -> None:
    gen = torch.Generator().manual_seed(1)
    for perm in (q_fused_permutation(16, D), o_fused_permutation(G, D)):
        inv = inverse_permutation(perm)
        n = perm.numel()
        assert torch.equal(perm[inv], torch.arange(n)) and torch.equal(inv[perm], torch.arange(n))
    q = torch.randn(3, 16, D, generator=gen)
    assert torch.equal(permute_q_from_fused(permute_q_to_fused(q).flatten(-2), 16, D), q)
    o = torch.randn(3, 16, D, generator=gen)
    assert torch.equal(permute_o_from_fused(permute_o_to_fused(o, G).flatten(-2), 16, G), o)


def test_to_fused_keeps_the_input_shape_and_the_input() -> None:
    """As vLLM's functions of these names: ``[N, H, D]`` in, ``[N, H, D]`` out, a new tensor
    (the input untouched), holding the fused order of ``H * D``."""
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(5, 16, D, generator=gen)
    before = x.clone()
    for fused, perm in ((permute_q_to_fused(x), q_fused_permutation(16, D)),
                        (permute_o_to_fused(x, G),
                         torch.cat([g * G * D + o_fused_permutation(G, D) for g in range(2)]))):
        assert fused.shape == x.shape and fused.data_ptr() != x.data_ptr()
        assert torch.equal(fused.flatten(-2), x.flatten(-2)[:, perm])
    assert torch.equal(x, before)


def test_wq_b_gemm_emits_fused_q() -> None:
    gen = torch.Generator().manual_seed(2)
    heads, k, m = 8, 96, 5
    w = torch.randn(heads * D, k, generator=gen, dtype=torch.float64)
    x = torch.randn(m, k, generator=gen, dtype=torch.float64)
    fused = x @ w[q_fused_permutation(heads, D)].T
    plain = (x @ w.T).view(m, heads, D)
    want = permute_q_to_fused(plain).flatten(-2)
    torch.testing.assert_close(fused, want, rtol=1e-12, atol=1e-12)
    # Element by element: fused column (c, h, j) is head h, dim c * 16 + j.
    f = fused.view(m, D // 16, heads, 16)
    torch.testing.assert_close(f[:, 5, 3, 7], plain[:, 3, 5 * 16 + 7], rtol=1e-12, atol=1e-12)


def test_wo_a_gemm_reads_fused_o() -> None:
    gen = torch.Generator().manual_seed(3)
    groups, o_rank, m = 2, 48, 4
    w = torch.randn(groups, o_rank, G * D, generator=gen, dtype=torch.float64)
    o = torch.randn(m, groups * G, D, generator=gen, dtype=torch.float64)
    plain = torch.einsum("mgk,gnk->mgn", o.view(m, groups, G * D), w)
    w_fused = w[:, :, o_fused_permutation(G, D)]
    xo = permute_o_to_fused(o, G).view(m, groups, G * D)
    fused = torch.einsum("mgk,gnk->mgn", xo, w_fused)
    torch.testing.assert_close(fused, plain, rtol=1e-12, atol=1e-12)


def test_chunk_permutation_moves_scales_with_values() -> None:
    chunk = o_fused_chunk_permutation(G, D)
    perm = o_fused_permutation(G, D)
    assert torch.equal(chunk, perm[::32] // 32)
    # Each fused 32-column chunk is one whole standard chunk.
    assert torch.equal(perm.view(-1, 32), chunk[:, None] * 32 + torch.arange(32))
    # An MX-quantized standard-layout row, values permuted by perm and codes by chunk,
    # dequantizes to the permuted row.
    gen = torch.Generator().manual_seed(4)
    o = torch.randn(3, G * D, generator=gen) * torch.exp2(torch.randint(-8, 8, (3, G * D // 32),
                                                                        generator=gen).float()
                                                          ).repeat_interleave(32, dim=1)
    values, codes = mxfp8_quantize(o)
    deq = mxfp8_dequantize(permute(values, perm, 1), permute(codes, chunk, 1))
    assert torch.equal(deq, mxfp8_dequantize(values, codes)[:, perm])


def test_one_byte_permutation() -> None:
    gen = torch.Generator().manual_seed(5)
    perm = q_fused_permutation(4, D)[: 4 * D]
    e4m3 = (torch.randn(4 * D, 6, generator=gen) * 50).to(E4M3)
    got = permute(e4m3, perm, 0)
    assert got.dtype == E4M3
    assert torch.equal(got.float(), e4m3.float()[perm])
    codes = torch.randint(100, 150, (3, 4 * D), generator=gen, dtype=torch.uint8)
    e8m0 = codes.view(torch.float8_e8m0fnu)
    got = permute(e8m0, perm, 1)
    assert got.dtype == torch.float8_e8m0fnu
    assert torch.equal(got.float(), e8m0.float()[:, perm])
    assert torch.equal(permute(codes, perm, 1), codes[:, perm])


def _counting_loader(calls: list):
    def loader(param, loaded, shard=None):
        calls.append(shard)
        param.data.copy_(loaded)

    return loader


def test_permute_on_load(monkeypatch) -> None:
    gen = torch.Generator().manual_seed(6)
    perm = q_fused_permutation(2, 64)
    assert not torch.equal(perm[perm], perm)  # applying it twice would show
    permutes = []
    real_permute = fused_layout.permute

    def counting_permute(t, p, dim):
        permutes.append(dim)
        return real_permute(t, p, dim)

    monkeypatch.setattr(fused_layout, "permute", counting_permute)
    param = torch.nn.Parameter(torch.zeros(128, 32, dtype=E4M3), requires_grad=False)
    inner_calls: list = []
    param.weight_loader = _counting_loader(inner_calls)
    permute_on_load(param, perm, 0)
    for load in range(3):
        w = (torch.randn(128, 32, generator=gen) * 10).to(E4M3)
        param.weight_loader(param, w, f"shard{load}")
        assert inner_calls == [f"shard{i}" for i in range(load + 1)]
        assert permutes == [0] * (load + 1)
        assert torch.equal(param.data.float(), w.float()[perm])


def test_permute_on_load_default_loader_and_columns() -> None:
    gen = torch.Generator().manual_seed(7)
    param = torch.nn.Parameter(torch.zeros(4, G * D // 32, dtype=torch.uint8), requires_grad=False)
    chunk = o_fused_chunk_permutation(G, D)
    permute_on_load(param, chunk, 1)
    for _ in range(2):
        codes = torch.randint(0, 255, tuple(param.shape), generator=gen, dtype=torch.uint8)
        param.weight_loader(param, codes)
        assert torch.equal(param.data, codes[:, chunk])
    with pytest.raises(ValueError, match=r"expected shape \(4, 128\), got \(4, 127\)"):
        param.weight_loader(param, codes[:, :127])


def test_layer_weights_fused_after_repeated_loads() -> None:
    dims = Dims.of("tiny", 2)
    m = dims.model
    rank = 1
    layer = LayerWeights(dims, rank, layer_id=1)
    for seed in (11, 12):
        tensors = synth_layer_tensors(dims, 1, torch.Generator().manual_seed(seed))
        layer.load_weights(tensors.items())
        prefix = "layers.1.attn."
        rows = slice(rank * dims.q_rows, (rank + 1) * dims.q_rows)
        wq_b = tensors[prefix + "wq_b.weight"][rows].float()
        q_perm = _q_formula(dims.heads, D)
        assert torch.equal(layer.wq_b.float(), wq_b[q_perm])
        wq_b_scale = tensors[prefix + "wq_b.scale"].view(torch.uint8).repeat_interleave(32, 0)[rows]
        assert torch.equal(layer.wq_b_scale, wq_b_scale[q_perm])
        o_rows = slice(rank * dims.o_rows, (rank + 1) * dims.o_rows)
        wo_a = tensors[prefix + "wo_a.weight"][o_rows].float()
        o_perm = _o_formula(m.heads_per_group, D)
        assert torch.equal(layer.wo_a.float(), wo_a[:, o_perm])
        wo_a_scale = tensors[prefix + "wo_a.scale"].view(torch.uint8).repeat_interleave(32, 0)
        wo_a_scale = wo_a_scale[o_rows]
        assert torch.equal(layer.wo_a_scale, wo_a_scale[:, o_perm[::32] // 32])


def test_quantize_then_permute_rows_matches_permuted_dequant() -> None:
    """Per-row scales let rows move one by one: dequant(permuted) = permuted dequant."""
    gen = torch.Generator().manual_seed(8)
    w = torch.randn(4 * D, 64, generator=gen)
    values, block_codes = quantize_weight_blocks(w)
    row_codes = block_codes.repeat_interleave(32, dim=0)
    perm = q_fused_permutation(4, D)
    deq = mxfp8_dequantize(permute(values, perm, 0), permute(row_codes, perm, 0))
    assert torch.equal(deq, mxfp8_dequantize(values, row_codes)[perm])
