"""Step inputs the shared builders never make, on every backend they apply to (tiny geometry,
Triton interpreter on CPU), and one step recomputed in float64 without ``dsv41.common``.

``make_scenario`` / ``build_key_table`` feed both the kernels and the reference, so a bug in
them is invisible to a kernel test; here key tables and slot mappings are written by hand:
gaps, -1 entries, entries past a cache, duplicates, a token with no valid key, and tokens of
one sequence in one step where each reads the records the step inserts for the ones before
it (speculative decoding). Bounds are what each backend measured on CPU
(``test_step_tolerances.py``).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from step_helpers import assert_within, hand_written_step, run_step, step_errors
from test_step_tolerances import BOUNDS

from dsv41.common.geometry import Dims
from dsv41.common.reference import reference_step, sum_rank_partials
from dsv41.common.scenario import make_scenario
from dsv41.common.step_inputs import clone_cache
from dsv41.common.weights import LayerWeights
from dsv41.config import load_model_config
from dsv41.layer import CacheMetadata, DSV41Attention

TP8_SUM_REL = 8e-3  # 8 bf16 partials summed against one bf16 y: measured 2.6e-3 (reference ranks)
@pytest.fixture(scope="module")
def layers():
    made = {}

    def get(tp: int, layer_id: int) -> LayerWeights:
        if (tp, layer_id) not in made:
            lw = LayerWeights(Dims.of("tiny", tp), tp - 1, layer_id)
            lw.dummy_load(seed=40 + tp + layer_id)
            made[tp, layer_id] = lw
        return made[tp, layer_id]

    return get


CASES = [  # (backend, tp, layer)
    ("nvidia", 2, 1), pytest.param("nvidia", 4, 0, marks=pytest.mark.slow),
    pytest.param("mono", 2, 0, marks=pytest.mark.slow),
    pytest.param("mono", 4, 1, marks=pytest.mark.slow),
]


@pytest.mark.parametrize("backend,tp,layer_id", CASES)
def test_hand_written_key_table_and_slots(layers, backend, tp, layer_id):
    lw = layers(tp, layer_id)
    inputs = hand_written_step(lw, seed=tp + layer_id)
    ref = run_step("reference", lw, inputs)
    if lw.layer_id == 0:  # token 4 has no valid key: o = 0, its lse -inf
        assert bool(ref.seams["xo"][0][4].eq(0).all())
    got = run_step(backend, lw, inputs)
    assert_within(step_errors(got, ref), BOUNDS[backend])


def test_reference_reads_what_the_hand_written_table_names(layers):
    """The reference's keys are the records the table names: the step's own new records
    (speculative decoding) included, duplicates counted twice, the rest none."""
    lw = layers(2, 0)
    inputs = hand_written_step(lw, seed=5)
    work = inputs.clone_caches()


    seams = reference_step(lw, work)
    # token 3 reads token 2's new record at slot 60: the inserted kv, not the old one
    new = work.window_cache.dequantize(torch.tensor([60]))
    old = inputs.window_cache.dequantize(torch.tensor([60]))
    assert not torch.equal(new, old)
    assert torch.isinf(seams.lse[4]).all() and bool((seams.lse[4] < 0).all())
    assert torch.isfinite(seams.lse[:4]).all()


# -- one token's step in float64, written here without dsv41.common ----------------------


def _e8m0(amax: torch.Tensor) -> torch.Tensor:
    """``clamp(ceil(log2(amax / 448)) + 127, 0, 254)``, amax 0 -> 0 (float64 log2 is exact on
    powers of two)."""
    code = torch.ceil(torch.log2(amax / 448.0)) + 127
    return torch.where(amax > 0, code, torch.zeros_like(code)).clamp(0, 254)


def _mx(x: torch.Tensor) -> torch.Tensor:
    """The MXFP8 round trip along the last dim: 32 values a code, e4m3 nearest even."""
    blocks = x.reshape(*x.shape[:-1], -1, 32)
    scale = torch.exp2(_e8m0(blocks.abs().amax(-1, keepdim=True)) - 127)
    e4m3 = (blocks / scale).float().to(torch.float8_e4m3fn).double()
    return (e4m3 * scale).reshape(x.shape)


def _w(values: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """A weight e4m3 [N, K] with a code per 32 of K, float64."""
    scale = torch.exp2(codes.double() - 127).repeat_interleave(32, -1)
    return values.double() * scale


def _bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).double()


def _rope(v: torch.Tensor, pos: int, theta: float, nope: int, sign: float) -> torch.Tensor:
    """GPT-J pairs (nope + 2i, nope + 2i + 1) turned by ``sign * pos * theta^(-2i / rope)``."""
    out = v.clone()
    rope = v.shape[-1] - nope
    i = torch.arange(rope // 2, dtype=torch.float64)
    angle = sign * pos * theta ** (-2 * i / rope)
    c, s = torch.cos(angle), torch.sin(angle)
    v0, v1 = v[..., nope::2], v[..., nope + 1 :: 2]
    out[..., nope::2], out[..., nope + 1 :: 2] = v0 * c - v1 * s, v0 * s + v1 * c
    return out


def test_reference_matches_float64_recomputation(layers):
    """Token 0 of a window-only layer at position 40 (its keys: 9 hand-picked window slots,
    its own new record among them): x8, qkv, norms, RoPE, the fused Q and O layouts undone by
    their formulas, attention with the sink, inverse RoPE, xo, z, y, each rounding point as
    docs/design.md §2 puts it, in float64. The keys are read back through the cache
    (its record format is checked in test_kv_cache.py)."""
    lw = layers(2, 0)
    dims, m = lw.dims, lw.dims.model
    inputs = hand_written_step(lw, seed=11)
    ref = run_step("reference", lw, inputs)
    after = inputs.clone_caches()


    reference_step(lw, after)  # the caches after the step, to read token 0's keys from
    heads, hd, nope, g = dims.heads, m.head_dim, m.nope_dim, m.heads_per_group
    theta, pos = 10000.0, 40
    assert m.compress_ratios[0] == 0 and m.rope_for_layer(0).theta == theta

    x8 = _mx(inputs.x[:1].double())
    qkv = _bf16(x8 @ _w(lw.wqkv, lw.wqkv_scale).T)[0]
    qr, kv = qkv[: m.q_rank], qkv[m.q_rank :]
    norm = lambda v, w: _bf16(v / torch.sqrt((v * v).mean() + m.eps) * w.double())  # noqa: E731
    kv = _bf16(_rope(norm(kv, lw.kv_norm), pos, theta, nope, 1.0))
    q_fused = _bf16(_mx(norm(qr, lw.q_norm)) @ _w(lw.wq_b, lw.wq_b_scale).T)
    # fused Q: standard (h, d) at (d // 16) * heads * 16 + h * 16 + d % 16
    h_idx, d_idx = torch.meshgrid(torch.arange(heads), torch.arange(hd), indexing="ij")
    q = q_fused[(d_idx // 16) * heads * 16 + h_idx * 16 + d_idx % 16]
    q = _bf16(_rope(q, pos, theta, nope, 1.0))

    slots = [s for s in inputs.key_table[0].tolist() if 0 <= s < inputs.window_cache.num_slots]
    keys = after.window_cache.dequantize(torch.tensor(slots)).double()
    assert slots[-1] == 26 and torch.allclose(keys[-1], kv, rtol=0.07, atol=0.07)  # its own
    s = q @ keys.T * hd**-0.5
    lse = torch.logsumexp(s, -1)
    o = torch.softmax(s, -1) @ keys / (1 + torch.exp(lw.attn_sink.double() - lse))[:, None]
    o = _bf16(_rope(o, pos, theta, nope, -1.0))
    xo = _mx(o)  # [heads, 512], 32 dims of one head a code
    # fused O, per group of g heads: standard (h, c * 32 + j) at (c * g + h) * 32 + j
    wo_a = _w(lw.wo_a, lw.wo_a_scale)
    z = []
    for group in range(heads // g):
        block = xo[group * g : (group + 1) * g].reshape(g, hd // 32, 32).transpose(0, 1)
        z.append(wo_a[group * m.o_rank : (group + 1) * m.o_rank] @ block.reshape(-1))
    z = _bf16(torch.cat(z))
    y = _bf16(_mx(z) @ _w(lw.wo_b, lw.wo_b_scale).T)

    def rel(a, b):
        return float((a.double() - b).norm() / b.norm())

    # Measured: q, xo, z, y rel 0 (every value equal); the bounds leave room for a rare
    # double-rounding flip (float64 -> bf16 here, fp32 -> bf16 there).
    assert rel(ref.seams["q"][0], q) <= 1e-3
    assert rel(ref.seams["xo"][0][0], xo) <= 1e-3
    assert rel(ref.seams["z"][0], z) <= 1e-3
    assert rel(ref.seams["y"][0], y) <= 1e-3
    assert math.isfinite(float(y.norm())) and float(y.norm()) > 0


# -- tp 8 end to end; a mono layer's prefill step --------------------------------------------


@pytest.mark.slow
def test_tp8_ranks_sum_to_the_whole_layer():
    """nvidia at tp 8 (the tiny model with 64 heads, one wo_a group a rank): each rank within
    its bounds of the reference, and the 8 partials summed equal to the tp 1 reference's y."""
    model = dataclasses.replace(load_model_config("tiny"), n_heads=64, o_groups=8)
    sc = make_scenario(Dims.of(model, 1), 1, 2, seed=13)
    whole = LayerWeights(Dims.of(model, 1), 0, 1)
    whole.dummy_load(seed=8)
    want = reference_step(whole, sc.clone_caches()).y
    partials = []
    for rank in range(8):
        lw = LayerWeights(Dims.of(model, 8), rank, 1)
        lw.dummy_load(seed=8)
        got = run_step("nvidia", lw, sc)
        assert_within(step_errors(got, run_step("reference", lw, sc)), BOUNDS["nvidia"])
        partials.append(got.seams["y"].bfloat16())
    y = sum_rank_partials(partials).float()
    rel = float((y - want.float()).norm() / want.float().norm())
    assert rel <= TP8_SUM_REL, rel


@pytest.mark.slow
def test_mono_layer_runs_a_prefill_step_on_the_nvidia_path():
    """A mono layer (48 tokens a step at most) given 50 tokens: nvidia's kernels run it, within
    nvidia's bounds of the reference; mono's forward is never called."""
    layer = DSV41Attention("tiny", 2, 1, 1, backend="mono")
    assert layer.backend == "mono"
    layer.weights.dummy_load(4)

    def refuse(*args):
        raise AssertionError("mono's forward called with more than 48 tokens")

    layer._forward = refuse
    sc = make_scenario(layer.dims, 1, 50, seed=8)
    want = reference_step(layer.weights, sc.clone_caches()).y
    y = layer(sc.x, sc.positions,
              CacheMetadata(sc.slot_mapping, sc.key_table, sc.window_cache, sc.compressed_cache))
    rel = float((y.float() - want.float()).norm() / want.float().norm())
    assert rel <= BOUNDS["nvidia"]["y"]["rel_l2"], rel


# -- the bad-value contract (docs/bad_inputs.md) on hand-written inputs ----------------------


def bad_value_step(lw: LayerWeights):
    """``hand_written_step`` with token 1 a padding token (slot -1: its record at 48 stays the
    old one), token 4's slot past the window cache (nothing stored), token 0 at a position past
    the RoPE tables (no turn) and a NaN in token 2's x (its y row NaN, and token 3's, which
    reads token 2's new record)."""
    inputs = hand_written_step(lw, seed=21)
    slots = inputs.slot_mapping.clone()
    slots[1], slots[4] = -1, inputs.window_cache.num_slots + 3
    positions = inputs.positions.clone()
    positions[0] = lw.dims.model.max_position + 5
    x = inputs.x.clone()
    x[2, 7] = float("nan")
    return dataclasses.replace(inputs, slot_mapping=slots, positions=positions, x=x)


BAD_VALUE_CASES = [("nvidia", 2, 1), ("mono", 4, 0)]  # 3 s and 14 s


@pytest.mark.parametrize("backend,tp,layer_id", BAD_VALUE_CASES)
def test_bad_values_give_the_contract_answer(layers, backend, tp, layer_id):
    lw = layers(tp, layer_id)
    inputs = bad_value_step(lw)
    ref = run_step("reference", lw, inputs)
    y = ref.seams["y"]
    assert torch.isnan(y[2]).all() and torch.isnan(y[3]).all()
    assert torch.isfinite(y[[0, 1, 4]]).all()
    cache = clone_cache(inputs.window_cache)
    slots = torch.arange(cache.num_slots)
    records = cache.read(slots)
    cache.data = ref.window
    after = cache.read(slots)
    assert torch.equal(after[48], records[48])  # the padding token stored nothing
    changed = (after != records).any(-1).nonzero().flatten().tolist()
    assert changed == [26, 60, 61], changed  # tokens 0, 2 and 3 only
    got = run_step(backend, lw, inputs)
    bounds = {k: v for k, v in BOUNDS[backend].items() if k != "window"}
    assert_within(step_errors(got, ref), bounds)
    cache.data = got.window  # every record equal, token 2's NaN one as a NaN (sign free)
    mine = cache.read(slots)
    assert torch.equal(torch.cat([mine[:60], mine[61:]]), torch.cat([after[:60], after[61:]]))
    nan_got, nan_ref = cache.dequantize(slots[60:61]), clone_cache(cache)
    nan_ref.data = ref.window
    assert torch.equal(torch.isnan(nan_got), torch.isnan(nan_ref.dequantize(slots[60:61])))
    assert bool(torch.isnan(nan_got).any())
