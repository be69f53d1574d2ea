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
from step_helpers import EXACT, assert_within, run_step, step_errors
from test_step_tolerances import BOUNDS

from dsv41.common.geometry import Dims
from dsv41.common.kv_cache import PagedKVCache
from dsv41.common.reference import reference_step
from dsv41.common.step_inputs import StepInputs
from dsv41.common.weights import LayerWeights

FLAG = 1 << 31  # a compressed-cache row in the key table: slot | 1 << 31 (int32 bits)


def _comp(row: int) -> int:
    return row - FLAG  # row | 1 << 31 as a signed int32


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


def hand_written_step(lw: LayerWeights, seed: int = 0) -> StepInputs:
    """Five tokens, window block 16 (tiny), a 6-page window cache with a record in every
    slot and a 64-row compressed cache (compressed layers):

    token 0  position 40: window keys at slots 16..25 with gaps and -1s, its own record at 26
    token 1  position 7: its own record at 48, entries past the window and compressed caches
    token 2  position 100: its own new record (slot 60) three times (duplicates), slot 5 twice
    token 3  position 101, the sequence of token 2: reads token 2's new record (slot 60) and
             inserts its own at 61, which token 4 reads
    token 4  position 102: no valid key at all in a window-only layer (-1 and past the cache)
             else compressed rows only, and token 3's new record
    """
    m = lw.dims.model
    gen = torch.Generator().manual_seed(seed)
    window = PagedKVCache(6, m.window_block, "fp8_ds_mla")
    window.insert(torch.arange(window.num_slots), torch.randn(window.num_slots, m.kv_dim,
                                                              generator=gen).bfloat16())
    comp = None
    if m.compress_ratios[lw.layer_id]:
        comp = PagedKVCache(1, 64, "fp8_ds_mla")
        comp.insert(torch.arange(64), torch.randn(64, m.kv_dim, generator=gen).bfloat16())
    n_win, keys = window.num_slots, m.keys
    rows = [
        [16, 17, -1, 19, 22, -1, -1, 25, 26],
        [n_win, 48, n_win + 100, 3],
        [60, 60, 5, 5, 60],
        [60, 61, 59],
        [-1, n_win + 1],
    ]
    if comp is not None:
        rows[0] = [_comp(3), -1, _comp(40), *rows[0]]
        rows[1] = [_comp(64), _comp(63), _comp(64 + 7), *rows[1]]
        rows[2] = [_comp(9), _comp(9), *rows[2]]
        rows[4] = [_comp(0), _comp(1), 61, *rows[4]]
    table = torch.full((5, keys), -1, dtype=torch.int32)
    for t, row in enumerate(rows):
        table[t, : len(row)] = torch.tensor(row, dtype=torch.int64).to(torch.int32)
    return StepInputs(
        x=torch.randn(5, m.hidden, generator=gen).bfloat16(),
        positions=torch.tensor([40, 7, 100, 101, 102]),
        slot_mapping=torch.tensor([26, 48, 60, 61, 62]),
        key_table=table, window_cache=window, compressed_cache=comp,
    )  # fmt: skip


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
