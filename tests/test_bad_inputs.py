"""The bad-value contract (docs/bad_inputs.md), the same in every backend (issue 37, 4 + 6): a
slot of -1 or outside the window cache stores nothing; a position outside [0, max_position)
turns nothing; a key-table entry outside its cache is no key; ``compressed_cache=None`` on a
compressed layer is an error naming it; a NaN / Inf in a token's x gives that token a NaN y
row (as torch would) and leaves the others alone, the MXFP8 cast giving the NaN code (255) in torch and in
Triton alike. ``validate=True`` / ``DSV41_VALIDATE=1`` refuse each bad value by name."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import triton
import triton.language as tl

from dsv41 import backends
from dsv41.common.geometry import Dims
from dsv41.common.kv_cache import COMPRESSED_FLAG, PagedKVCache, pack_records
from dsv41.common.kv_records_tl import fmt_id, store_record_tl
from dsv41.common.mx import (
    E8M0_NAN,
    mx_parts_tl,
    mx_quantize_tl,
    mx_round_tl,
    mxfp8_dequantize,
    mxfp8_quantize,
)
from dsv41.common.reference import reference_step, rmsnorm
from dsv41.common.scenario import make_scenario
from dsv41.common.step_inputs import StepInputs
from dsv41.common.weights import LayerWeights
from dsv41.layer import CacheMetadata, DSV41Attention

LAYER = 1  # a compressed layer of the tiny model
NAN_TOKEN, NO_SLOT, OUTSIDE = 1, 2, 3  # the bad tokens of ``_bad_step``


@pytest.fixture(scope="module")
def layer() -> LayerWeights:
    lw = LayerWeights(Dims.of("tiny", 2), 1, LAYER)
    lw.dummy_load(37)
    return lw


def _int32(entry: int) -> int:
    return entry - (1 << 32) if entry >= 1 << 31 else entry


def _bad_step(lw: LayerWeights, nan: bool = True) -> tuple[StepInputs, StepInputs]:
    """(a step of 4 tokens with every kind of bad value, the same step with its bad key-table
    entries written as -1): token 1 a NaN in x; token 2 slot -1 and a position past
    max_position; token 3 a slot past the cache and a negative position; a window entry and a
    compressed entry outside their caches."""
    sc = make_scenario(lw.dims, LAYER, 4, seed=41)
    m = lw.dims.model
    x, positions, slots, table = (sc.x.clone(), sc.positions.clone(), sc.slot_mapping.clone(),
                                  sc.key_table.clone())  # fmt: skip
    if nan:
        x[NAN_TOKEN, 7] = float("nan")
    positions[NO_SLOT], positions[OUTSIDE] = m.max_position + 5, -3
    slots[NO_SLOT], slots[OUTSIDE] = -1, sc.window_cache.num_slots + 2
    clean = table.clone()
    table[0, -1] = sc.window_cache.num_slots + 9
    table[OUTSIDE, -1] = _int32((sc.compressed_cache.num_slots + 4) | COMPRESSED_FLAG)
    clean[0, -1] = clean[OUTSIDE, -1] = -1
    bad = StepInputs(x, positions, slots, table, sc.window_cache, sc.compressed_cache)
    return bad, dataclasses.replace(bad, key_table=clean)


def test_reference_follows_the_contract(layer):
    bad, clean = _bad_step(layer)
    m = layer.dims.model
    before = bad.window_cache.data.clone()
    run = bad.clone_caches()
    seams = reference_step(layer, run)  # no raise
    # Stores: only the tokens with a slot in the cache, with the records of their kv.
    want = PagedKVCache(1, 1, bad.window_cache.fmt)
    want.data, want.block = before.clone(), bad.window_cache.block
    want.insert(bad.slot_mapping[:2], seams.kv[:2])
    assert torch.equal(run.window_cache.data, want.data)
    # Positions outside the tables: kv not turned (the normed kv itself).
    unturned = rmsnorm(seams.qkv[:, m.q_rank:], layer.kv_norm, m.eps)
    assert torch.equal(seams.kv[[NO_SLOT, OUTSIDE]], unturned[[NO_SLOT, OUTSIDE]])
    assert not torch.equal(seams.kv[0], unturned[0])
    # Key-table entries outside their caches: as -1.
    y_clean = reference_step(layer, clean.clone_caches()).y
    assert torch.equal(seams.y.isnan(), y_clean.isnan())
    assert torch.equal(seams.y.nan_to_num(), y_clean.nan_to_num())
    # NaN in x: a NaN row, as torch's softmax gives; the other rows as with a finite x.
    assert seams.y[NAN_TOKEN].isnan().all()
    finite, _ = _bad_step(layer, nan=False)
    other = [0, NO_SLOT, OUTSIDE]
    assert torch.equal(seams.y[other], reference_step(layer, finite.clone_caches()).y[other])


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["nvidia", "mono"])
def test_kernels_answer_bad_values_as_the_reference(layer, backend):
    bad, _ = _bad_step(layer)
    ref = reference_step(layer, bad.clone_caches()).y
    run = bad.clone_caches()
    y = backends.get(backend).step(layer, run)["y"]
    other = [0, NO_SLOT, OUTSIDE]
    assert y[NAN_TOKEN].isnan().all() and not y[other].isnan().any()
    rel = (y[other].float() - ref[other].float()).norm() / ref[other].float().norm()
    assert rel <= 1e-2, rel
    # Nothing stored but the records of tokens 0 and 1 (their pages' bytes).
    cache, before = run.window_cache, bad.window_cache.data
    touched = {int(s) // cache.block for s in bad.slot_mapping[:2]}
    for page in range(cache.data.shape[0]):
        if page not in touched:
            assert torch.equal(cache.data[page], before[page]), page
    assert torch.equal(run.compressed_cache.data, bad.compressed_cache.data)


def test_a_compressed_layer_refuses_no_compressed_cache(layer):
    sc = make_scenario(layer.dims, LAYER, 2, seed=42)
    inputs = dataclasses.replace(sc, compressed_cache=None)
    with pytest.raises(ValueError, match=r"compressed_cache: layer 1 is compressed \(ratio \d+\); "
                                         r"expected a PagedKVCache, got None"):
        reference_step(layer, inputs)
    attn = DSV41Attention("tiny", 2, 1, LAYER, backend="reference")
    with pytest.raises(ValueError, match="compressed_cache: layer 1 is compressed"):
        attn(sc.x, sc.positions, CacheMetadata(sc.slot_mapping, sc.key_table, sc.window_cache))


# -- the MXFP8 cast of NaN / Inf: the NaN code in torch and in Triton ------------------------


@triton.jit
def _cast_kernel(x_ptr, v_ptr, c_ptr, R: tl.constexpr, C: tl.constexpr):
    r = tl.arange(0, R)[:, None]
    x = tl.load(x_ptr + r * C + tl.arange(0, C)[None, :])
    v, code = mx_quantize_tl(x, R, C)
    tl.store(v_ptr + r * C + tl.arange(0, C)[None, :], v)
    tl.store(c_ptr + r * (C // 32) + tl.arange(0, C // 32)[None, :], code.to(tl.uint8))


@triton.jit
def _store_kernel(cache_ptr, slots_ptr, kv_ptr, num_slots, BLOCK_TOKENS: tl.constexpr,
                  FMT: tl.constexpr, R: tl.constexpr):  # fmt: skip
    rows = tl.arange(0, R)
    kv = tl.load(kv_ptr + rows[:, None] * 512 + tl.arange(0, 512)[None, :])
    store_record_tl(cache_ptr, tl.load(slots_ptr + rows), kv, num_slots, BLOCK_TOKENS, FMT)


def _with_bad_values(rows: int, cols: int) -> torch.Tensor:
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(43))
    x[0, 3], x[1, 40], x[2, 0] = float("nan"), float("inf"), -float("inf")
    x[3, 5] = 3e38  # finite and huge: a finite code
    return x


def test_mx_cast_of_nan_and_inf_is_the_nan_code_in_torch_and_triton():
    x = _with_bad_values(4, 64)
    values, codes = mxfp8_quantize(x)
    bad_block = torch.zeros(4, 2, dtype=torch.bool)
    bad_block[0, 0] = bad_block[1, 1] = bad_block[2, 0] = True
    assert torch.equal(codes == E8M0_NAN, bad_block)
    deq = mxfp8_dequantize(values, codes).view(4, 2, 32)
    assert deq[bad_block].isnan().all() and not deq[~bad_block].isnan().any()
    v = torch.empty(4, 64, dtype=torch.float8_e4m3fn)
    c = torch.empty(4, 2, dtype=torch.uint8)
    _cast_kernel[(1,)](x, v, c, 4, 64)
    assert torch.equal(c, codes)
    assert torch.equal(v.view(torch.uint8), values.view(torch.uint8))


@triton.jit
def _dequant_kernel(x_ptr, parts_ptr, round_ptr, R: tl.constexpr, C: tl.constexpr):
    at = tl.arange(0, R)[:, None] * C + tl.arange(0, C)[None, :]
    x = tl.load(x_ptr + at)
    values, scales = mx_parts_tl(x, R, C, False)
    blocks = tl.reshape(values, (R, C // 32, 32)) * scales[:, :, None]
    tl.store(parts_ptr + at, tl.reshape(blocks, (R, C)))
    tl.store(round_ptr + at, mx_round_tl(x, R, C))


def test_mx_parts_and_round_of_nan_and_inf_dequantize_as_torch():
    """The GEMMs' cast helpers give no NaN mask on their values: a NaN / Inf block's NaN scale
    makes its dequantized values NaN, every other block is torch's, bit for bit."""
    x = _with_bad_values(4, 64)
    want = mxfp8_dequantize(*mxfp8_quantize(x))
    parts, rounded = torch.empty(4, 64), torch.empty(4, 64)
    _dequant_kernel[(1,)](x, parts, rounded, 4, 64)
    for got in (parts, rounded):
        assert torch.equal(got.isnan(), want.isnan())
        assert torch.equal(got[~want.isnan()], want[~want.isnan()])


@pytest.mark.parametrize("fmt", ["fp8_ds_mla", "fp8_mx"])
def test_kv_record_of_nan_and_inf_is_the_same_in_torch_and_triton(fmt):
    kv = _with_bad_values(4, 512).bfloat16().float()
    cache = PagedKVCache(1, 4, fmt)
    slots = torch.arange(4)
    _store_kernel[(1,)](cache.data, slots, kv, cache.num_slots, BLOCK_TOKENS=4,
                        FMT=fmt_id(fmt), R=4)  # fmt: skip
    want = PagedKVCache(1, 4, fmt)
    want.insert(slots, kv)
    assert torch.equal(cache.data, want.data)
    assert torch.equal(want.read(slots), pack_records(kv, fmt))
    back = want.dequantize(slots)
    assert back[0].isnan().any() and back[1].isnan().any() and not back[3].isnan().any()


# -- validate=True / DSV41_VALIDATE=1 -------------------------------------------------------


@pytest.mark.parametrize("what,message", [
    ("x", r"x\[1, 7\]: expected a finite value, got nan"),
    ("positions", r"positions\[2\]: expected 0 <= position < max_position = 4096, got 4101"),
    ("slot_mapping", r"slot_mapping\[3\]: expected -1 \(padding\) or 0 <= slot < (\d+) \(the "
                     r"window cache's slots\), got \d+"),
    ("key_table", r"key_table\[0, \d+\]: expected -1 or a window slot < \d+ \(the window "
                  r"cache's slots\), got window slot \d+"),
])  # fmt: skip
def test_validate_names_the_argument_the_index_and_the_bound(layer, what, message, monkeypatch):
    monkeypatch.delenv("DSV41_BACKEND", raising=False)
    bad, _ = _bad_step(layer)
    good = make_scenario(layer.dims, LAYER, 4, seed=41)
    fields = {f: getattr(good, f) for f in ("x", "positions", "slot_mapping", "key_table")}
    fields[what] = getattr(bad, what)
    attn = DSV41Attention("tiny", 2, 1, LAYER, backend="reference", validate=True)
    attn.weights = layer
    meta = CacheMetadata(fields["slot_mapping"], fields["key_table"], good.window_cache,
                         good.compressed_cache)  # fmt: skip
    with pytest.raises(ValueError, match=message):
        attn(fields["x"], fields["positions"], meta)
    attn.validate = False
    attn(fields["x"], fields["positions"], meta)  # off: the contract's answer, no raise


def test_validate_is_off_by_default_and_on_with_the_switch(monkeypatch):
    monkeypatch.delenv("DSV41_BACKEND", raising=False)
    monkeypatch.delenv("DSV41_VALIDATE", raising=False)
    assert not DSV41Attention("tiny", 2, 1, LAYER, backend="reference").validate
    monkeypatch.setenv("DSV41_VALIDATE", "1")
    assert DSV41Attention("tiny", 2, 1, LAYER, backend="reference").validate
    assert not DSV41Attention("tiny", 2, 1, LAYER, backend="reference", validate=False).validate
    monkeypatch.setenv("DSV41_VALIDATE", "yes")
    with pytest.raises(ValueError, match="DSV41_VALIDATE: expected 0 or 1, got 'yes'"):
        DSV41Attention("tiny", 2, 1, LAYER, backend="reference")


def test_mono_schedule_executor_follows_the_contract(layer):
    """The torch executor of mono's schedule answers bad values as the kernel and the reference."""
    from dsv41.amd.mono.executor import ScheduleExecutor
    from dsv41.amd.mono.plan import Plan
    from dsv41.common.rope import rope_tables

    bad, _ = _bad_step(layer)
    ref = reference_step(layer, bad.clone_caches()).y
    plan = Plan(layer.dims, 4)
    y = torch.empty_like(bad.x)
    cos, sin = rope_tables(layer.dims.model, LAYER)
    ScheduleExecutor(plan, layer, cos, sin).run(plan.new_scratch(epoch=1), bad.clone_caches(), y)
    other = [0, NO_SLOT, OUTSIDE]
    assert y[NAN_TOKEN].isnan().all() and not y[other].isnan().any()
    rel = (y[other].float() - ref[other].float()).norm() / ref[other].float().norm()
    assert rel <= 1e-2, rel
