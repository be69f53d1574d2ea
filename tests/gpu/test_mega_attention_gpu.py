"""Mega attention on the GPU, real geometry (dsv41-flash, tp 4 and tp 2 shares), vs the reference.

Seam checked: ``reference_step``'s ``o`` -> ``mxfp8`` -> fused O layout (``xo``, codes) and ``lse``.
Acceptance: relative error of the dequantized xo <= 1e-2, E8M0 codes equal in >= 99.9 % of groups;
a CUDA-graph replay (split keys and combine, one split) equals the eager launch.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from dsv41.common.fused_layout import permute_o_to_fused
from dsv41.common.geometry import Dims
from dsv41.common.mx import mxfp8_dequantize, mxfp8_quantize
from dsv41.common.reference import mx_linear, reference_step
from dsv41.common.rope import rope_tables
from dsv41.common.scenario import make_scenario
from dsv41.common.weights import LayerWeights
from dsv41.nvidia.ops.mega_attention import mega_attention

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

MODEL = "dsv41-flash"
COMPRESSED_LAYER = 2  # compress ratio 1: top-k of a compressed cache + the window
WINDOW_LAYER = 0  # window only
TOKENS = (1, 2, 4, 8, 16, 32, 48)
FORMATS = ("fp8_ds_mla", "fp8_mx")


@functools.cache
def _layer(tp: int, layer_id: int) -> LayerWeights:
    layer = LayerWeights(Dims.of(MODEL, tp), 0, layer_id, device="cuda")
    layer.dummy_load(seed=11)
    return layer


def _step(tp: int, layer_id: int, tokens: int, fmt: str):
    layer = _layer(tp, layer_id)
    sc = make_scenario(layer.dims, layer_id, tokens, fmt=fmt, seed=tokens, device="cuda")
    seams = reference_step(layer, sc)
    q_fused = mx_linear(mxfp8_quantize(seams.qr), layer.wq_b, layer.wq_b_scale)
    return layer, sc, seams, q_fused


def _run(layer, sc, q_fused, **kw):
    m = layer.dims.model
    cos, sin = rope_tables(m, layer.layer_id, "cuda")
    return mega_attention(
        q_fused, sc.positions, sc.key_table, sc.window_cache, sc.compressed_cache, layer.attn_sink,
        cos, sin, softmax_scale=m.softmax_scale, heads_per_group=m.heads_per_group, **kw,
    )  # fmt: skip


def _check_against_reference(layer, seams, got):
    xo, codes, lse = got
    g = layer.dims.model.heads_per_group
    values, std_codes = seams.xo
    n, h, c = std_codes.shape
    want_codes = std_codes.view(n, h // g, g, c).transpose(2, 3).reshape(n, h * c)
    want_xo = permute_o_to_fused(mxfp8_dequantize(values, std_codes), g).flatten(-2)
    got_xo = mxfp8_dequantize(xo, codes)
    assert torch.isfinite(got_xo).all()
    rel = ((got_xo - want_xo).norm() / want_xo.norm()).item()
    assert rel <= 1e-2, f"relative error of xo {rel:.3e}"
    same = (codes == want_codes).float().mean().item()
    assert same >= 0.999, f"codes equal in {same:.5f} of groups"
    assert torch.equal(torch.isinf(lse), torch.isinf(seams.lse))
    fin = torch.isfinite(seams.lse)
    torch.testing.assert_close(lse[fin], seams.lse[fin], rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("tp", [4, 2])
def test_matches_reference(tp, tokens, fmt):
    layer, sc, seams, q_fused = _step(tp, COMPRESSED_LAYER, tokens, fmt)
    _check_against_reference(layer, seams, _run(layer, sc, q_fused))


@pytest.mark.parametrize("splits", [1, 7, 40])
def test_any_split_matches_reference(splits):
    layer, sc, seams, q_fused = _step(4, COMPRESSED_LAYER, 4, "fp8_ds_mla")
    _check_against_reference(layer, seams, _run(layer, sc, q_fused, splits=splits))


def test_window_layer():
    layer, sc, seams, q_fused = _step(4, WINDOW_LAYER, 8, "fp8_mx")
    assert sc.compressed_cache is None
    _check_against_reference(layer, seams, _run(layer, sc, q_fused))


@pytest.mark.parametrize("tokens", [1, 48])
def test_cuda_graph_replay_equals_eager(tokens):
    layer, sc, _, q_fused = _step(4, COMPRESSED_LAYER, tokens, "fp8_ds_mla")
    eager = _run(layer, sc, q_fused)  # compiles before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = _run(layer, sc, q_fused)
    for _ in range(3):
        for t in captured:
            t.view(torch.uint8).fill_(0)
        graph.replay()
        torch.cuda.synchronize()
        for a, b in zip(captured, eager):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def _same_bits_both_ways(run):
    """``run(False)`` and ``run(True)``: the same bits in every output; the outputs of True."""
    off, on = run(False), run(True)
    for a, b in zip(on, off):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    return on


@pytest.mark.parametrize("fmt", FORMATS)
def test_record_prefetch_changes_no_bit(fmt, monkeypatch):
    """Splits of several key blocks with and without the L2 prefetch of their records
    (``prefetch_records``, on on an NVIDIA GPU): the same bits, and the reference's seams."""
    from dsv41.nvidia.ops import mega_attention as attention

    layer, sc, seams, q_fused = _step(4, COMPRESSED_LAYER, 16, fmt)
    real = attention.prefetch_records
    assert real()

    def run(prefetch: bool):
        monkeypatch.setattr(attention, "prefetch_records", real if prefetch else lambda: False)
        return _run(layer, sc, q_fused, splits=7)

    _check_against_reference(layer, seams, _same_bits_both_ways(run))


@pytest.mark.parametrize("tokens", [1, 2])
def test_alone_changes_no_bit(tokens):
    """Programs holding their SMs alone (``AttentionTuning.alone``) compute the same bits, and the
    launch asked for a whole SM's shared memory."""
    from dsv41.nvidia.ops.launch import sm_count
    from dsv41.nvidia.ops.mega_attention import attention_tuning, mega_attention_kernel
    from dsv41.nvidia.ops.sm_share import whole_sm_shared_bytes

    layer, sc, seams, q_fused = _step(4, COMPRESSED_LAYER, tokens, "fp8_ds_mla")
    chosen = attention_tuning(tokens, layer.dims.heads, sc.key_table.shape[1],
                              sm_count(q_fused.device))  # fmt: skip
    on = _same_bits_both_ways(
        lambda alone: _run(layer, sc, q_fused, tuning=dataclasses.replace(chosen, alone=alone))
    )
    _check_against_reference(layer, seams, on)
    whole = whole_sm_shared_bytes(q_fused.device.index or 0)
    assert whole >= 200 * 1024
    shared = [k.metadata.shared for cache in mega_attention_kernel.device_caches.values()
              for k in cache[0].values()]  # fmt: skip
    assert whole in shared


@pytest.mark.parametrize("tokens", [1, 16, 48])
def test_key_blocks_match_the_reference(tokens):
    """Dots of 16 and 32 keys (the default's from 4 tokens), the keys as the A operand
    (``keys_a``) and 168 registers a thread (``max_registers``) match the reference on the GPU
    (tp 4)."""
    from dsv41.nvidia.ops.mega_attention import attention_tuning

    layer, sc, seams, q_fused = _step(4, COMPRESSED_LAYER, tokens, "fp8_ds_mla")
    base = attention_tuning(tokens, layer.dims.heads, sc.key_table.shape[1], 132)
    assert base.key_block == (32 if tokens >= 4 else 16)
    for change in ({"key_block": 16}, {"key_block": 32}, {"keys_a": True},
                   {"key_block": 16, "qk_split": 4, "max_registers": 168},
                   {"key_block": 16, "keys_a": True, "max_registers": 168}):
        tuning = dataclasses.replace(base, **change)
        _check_against_reference(layer, seams, _run(layer, sc, q_fused, tuning=tuning))
