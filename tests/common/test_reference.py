"""The reference step (docs/design.md §2): attention_core against a dense softmax; tp 1 / 2 / 4
agree."""

from __future__ import annotations

import math

import pytest
import torch

from dsv41.common.geometry import Dims
from dsv41.common.kv_cache import record_round
from dsv41.common.reference import Seams, attention_core, reference_step, sum_rank_partials
from dsv41.common.scenario import make_scenario
from dsv41.common.weights import LayerWeights

SEED = 17
TOKENS = 4


def dense_attention(q, keys, valid, sink, scale):
    """Tokens and heads one by one in float64: masked softmax, gate 1 / (1 + exp(sink - lse))."""
    m, h, d = q.shape
    o = torch.zeros(m, h, d, dtype=torch.float64)
    lse = torch.full((m, h), -math.inf, dtype=torch.float64)
    for t in range(m):
        k = keys[t][valid[t]].double()  # [n, d]
        if k.shape[0] == 0:
            continue
        for i in range(h):
            s = (k @ q[t, i].double()) * scale
            mx = s.max()
            total = torch.exp(s - mx).sum()
            lse[t, i] = mx + torch.log(total)
            p = torch.exp(s - lse[t, i])
            gate = 1.0 / (1.0 + math.exp(min(float(sink[i]) - float(lse[t, i]), 700.0)))
            o[t, i] = (p @ k) * gate
    return o, lse


def _attention_inputs(seed: int, m: int = 5, h: int = 6, k: int = 40, d: int = 64):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(m, h, d, generator=gen)
    keys = torch.randn(m, k, d, generator=gen)
    valid = torch.rand(m, k, generator=gen) < 0.6
    valid[1] = False  # a token with no valid key
    valid[2] = False
    valid[2, 7] = True  # and one with a single key
    sink = torch.randn(h, generator=gen) * 2
    return q, keys, valid, sink, d**-0.5 * 4  # a larger scale: peaked softmax


def test_attention_core_matches_dense() -> None:
    q, keys, valid, sink, scale = _attention_inputs(1)
    o, lse = attention_core(q, keys, valid, sink, scale)
    assert o.dtype == lse.dtype == torch.float32
    want_o, want_lse = dense_attention(q, keys, valid, sink, scale)
    torch.testing.assert_close(o.double(), want_o, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse.double(), want_lse, rtol=1e-5, atol=1e-5)
    # A head with no valid key: zeros, -inf lse, never NaN.
    assert (o[1] == 0).all() and torch.isneginf(lse[1]).all()
    assert not torch.isnan(o).any()
    # Invalid keys are ignored whatever they hold.
    poisoned = keys.clone()
    poisoned[~valid] = 1e4
    o2, lse2 = attention_core(q, poisoned, valid, sink, scale)
    assert torch.equal(o2, o) and torch.equal(lse2, lse)


def test_sink_limits() -> None:
    q, keys, valid, _, scale = _attention_inputs(2)
    h = q.shape[1]
    plain, lse = attention_core(q, keys, valid, torch.full((h,), -math.inf), scale)
    # sink -inf: plain softmax.
    s = torch.einsum("mhd,mkd->mhk", q.double(), keys.double()) * scale
    s = s.masked_fill(~valid[:, None, :], -math.inf)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # rows with no key: all NaN -> 0
    want = torch.einsum("mhk,mkd->mhd", p, keys.double())
    torch.testing.assert_close(plain.double(), want, rtol=1e-5, atol=1e-5)
    assert not torch.isnan(plain).any() and (plain[1] == 0).all()
    # sink +inf: everything goes to the sink.
    gone, lse_inf = attention_core(q, keys, valid, torch.full((h,), math.inf), scale)
    assert (gone == 0).all()
    assert torch.equal(lse_inf, lse)  # the sink does not enter lse
    # A sink equal to lse halves the output.
    half, _ = attention_core(q[:1], keys[:1], valid[:1], lse[0], scale)
    torch.testing.assert_close(half, plain[:1] / 2, rtol=1e-5, atol=1e-6)


def _run(tp: int, rank: int, layer_id: int, scenario) -> tuple[Seams, object]:
    layer = LayerWeights(Dims.of("tiny", tp), rank, layer_id)
    layer.dummy_load(SEED)
    sc = scenario.clone_caches()
    seams = reference_step(layer, sc)
    return seams, sc


@pytest.fixture(scope="module", params=[0, 1], ids=["window_layer", "compressed_layer"])
def runs(request):
    """Seams of every rank at tp 1, 2 and 4 for one step (same scenario, same weights)."""
    layer_id = request.param
    scenario = make_scenario(Dims.of("tiny", 1), layer_id, TOKENS, seed=SEED)
    out = {tp: [_run(tp, r, layer_id, scenario) for r in range(tp)] for tp in (1, 2, 4)}
    return scenario, out


def test_step_shapes_and_values(runs) -> None:
    _, out = runs
    (seams, _), = out[1]
    m = Dims.of("tiny", 1).model
    assert seams.q.shape == (TOKENS, m.n_heads, 512) and seams.q.dtype == torch.bfloat16
    assert seams.o.shape == (TOKENS, m.n_heads, 512) and seams.o.dtype == torch.bfloat16
    assert seams.z.shape == (TOKENS, m.o_groups, m.o_rank)
    assert seams.y.shape == (TOKENS, m.hidden) and seams.y.dtype == torch.bfloat16
    for t in (seams.qkv, seams.q, seams.o, seams.z, seams.y):
        assert torch.isfinite(t.float()).all() and t.float().abs().max() > 0
    # Every token has at least itself as a key, so every head has a finite lse.
    assert torch.isfinite(seams.lse).all()


def test_rank_seams_concatenate_to_tp1(runs) -> None:
    _, out = runs
    (full, _), = out[1]
    for tp in (2, 4):
        seams = [s for s, _ in out[tp]]
        for s in seams:
            # Replicated stages are bit-identical on every rank.
            assert torch.equal(s.qkv, full.qkv) and torch.equal(s.kv, full.kv)
            assert torch.equal(s.qr, full.qr)
        for name in ("q", "o", "lse"):
            cat = torch.cat([getattr(s, name) for s in seams], dim=1)
            torch.testing.assert_close(cat.float(), getattr(full, name).float(),
                                       rtol=2**-7, atol=1e-3, msg=f"tp {tp} seam {name}")
        z = torch.cat([s.z for s in seams], dim=1)
        torch.testing.assert_close(z.float(), full.z.float(), rtol=2**-6, atol=1e-2,
                                   msg=f"tp {tp} seam z")


def test_rank_partials_sum_to_tp1(runs) -> None:
    _, out = runs
    (full, _), = out[1]
    for tp in (2, 4):
        y = sum_rank_partials([s.y for s, _ in out[tp]])
        assert y.dtype == torch.bfloat16
        rel = (y.float() - full.y.float()).norm() / full.y.float().norm()
        assert rel < 1e-2, f"tp {tp}: relative error {rel:.3g}"
        # And a rank's partial alone is far from the whole.
        part = out[tp][0][0].y.float()
        assert (part - full.y.float()).norm() / full.y.float().norm() > 0.1


def test_kv_seam_inserted_at_slot_mapping(runs) -> None:
    scenario, out = runs
    for tp in (1, 4):
        seams, sc = out[tp][-1]
        got = sc.window_cache.dequantize(sc.slot_mapping)
        assert torch.equal(got, record_round(seams.kv, sc.window_cache.fmt))
        # The scenario's own cache is untouched (clone_caches), and only those slots changed.
        before = scenario.window_cache
        changed = (sc.window_cache.data != before.data).view(-1)
        touched = torch.zeros_like(changed)
        block = sc.window_cache.block
        assert sc.window_cache.fmt.name == "fp8_ds_mla"
        for slot in sc.slot_mapping.tolist():
            page, row = divmod(slot, block)
            data = page * block * 584 + row * 576  # docs/design.md §4: data rows, then scale rows
            scale = page * block * 584 + block * 576 + row * 8
            touched[data : data + 576] = True
            touched[scale : scale + 8] = True
        assert changed.any() and not (changed & ~touched).any()
