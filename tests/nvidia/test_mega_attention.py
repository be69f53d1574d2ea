"""Mega attention under the interpreter (tiny geometry) against the reference step's seams.

Seam checked: ``reference_step``'s ``o`` -> ``mxfp8`` -> fused O layout (``xo``, codes) and ``lse``,
given the un-RoPE'd fused q the ``wq_b`` GEMM emits. Variants of the key table and sink are
checked against the same reference pieces (``gather_keys``, ``attention_core``, inverse RoPE).
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
from sm90 import ptx_facts  # tests/nvidia/sm90.py

from dsv41.common.fused_layout import permute_o_to_fused
from dsv41.common.geometry import Dims
from dsv41.common.kv_cache import COMPRESSED_FLAG, NONE, PagedKVCache, gather_keys
from dsv41.common.mx import e8m0_scale, mxfp8_dequantize, mxfp8_quantize
from dsv41.common.platform import parse_target, targeting
from dsv41.common.reference import attention_core, mx_linear, reference_step
from dsv41.common.rope import apply_inverse_rope, rope_tables
from dsv41.common.scenario import make_scenario
from dsv41.common.weights import LayerWeights
from dsv41.nvidia.ops.mega_attention import (
    COMBINE_WIDE_SPLITS,
    KEY_BLOCK,
    attention_splits,
    attention_tuning,
    combine_programs,
    combine_wide,
    mega_attention,
    prefetch_records,
    register_cap,
    rows_aligned,
    score_segments,
    split_pieces,
)

FORMATS = ("fp8_ds_mla", "fp8_mx")
WINDOW_LAYER, COMPRESSED_LAYER = 0, 1  # tiny: compress ratios [0, 1, 2]


@functools.cache
def _layer(tp: int, layer_id: int) -> LayerWeights:
    layer = LayerWeights(Dims.of("tiny", tp), 0, layer_id)
    layer.dummy_load(seed=7)
    return layer


@functools.cache
def _step(tp: int, layer_id: int, tokens: int, fmt: str, seed: int = 0):
    """A reference step: its seams, the fused q the kernel reads, the caches after the insert."""
    layer = _layer(tp, layer_id)
    sc = make_scenario(layer.dims, layer_id, tokens, fmt=fmt, seed=seed).clone_caches()
    seams = reference_step(layer, sc)
    q_fused = mx_linear(mxfp8_quantize(seams.qr), layer.wq_b, layer.wq_b_scale)
    return layer, sc, seams, q_fused


def _fused(xo: tuple[torch.Tensor, torch.Tensor], g: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Standard MXFP8 ``(values [M, H, 512], codes [M, H, 16])`` -> fused (dequantized, codes)."""
    values, codes = xo
    m, h, c = codes.shape
    fused_codes = codes.view(m, h // g, g, c).transpose(2, 3).reshape(m, h * c)
    return permute_o_to_fused(mxfp8_dequantize(values, codes), g).flatten(-2), fused_codes


def _expected(layer, sc, seams, key_table, sink):
    """Fused dequantized xo, fused codes and lse from the reference pieces, any table / sink."""
    m = layer.dims.model
    cos, sin = rope_tables(m, layer.layer_id)
    keys, valid = gather_keys(key_table, sc.window_cache, sc.compressed_cache)
    o, lse = attention_core(seams.q, keys, valid, sink, m.softmax_scale)
    o = apply_inverse_rope(o, sc.positions, cos, sin, m.nope_dim).to(torch.bfloat16)
    return (*_fused(mxfp8_quantize(o), m.heads_per_group), lse)


def _run(layer, sc, q_fused, key_table=None, sink=None, splits=None, **tuning):
    """The attention of ``sc``; ``tuning``: ``AttentionTuning`` fields changed from the ones
    picked for its tokens and ``splits``."""
    m = layer.dims.model
    cos, sin = rope_tables(m, layer.layer_id)
    table = sc.key_table if key_table is None else key_table
    chosen = None
    if tuning:
        chosen = attention_tuning(table.shape[0], layer.dims.heads, table.shape[1], 8, splits)
        chosen = dataclasses.replace(chosen, **tuning)
    xo, codes, lse = mega_attention(
        q_fused, sc.positions, table, sc.window_cache, sc.compressed_cache,
        layer.attn_sink if sink is None else sink, cos, sin, softmax_scale=m.softmax_scale,
        heads_per_group=m.heads_per_group, splits=splits, tuning=chosen,
    )  # fmt: skip
    return mxfp8_dequantize(xo, codes), codes, lse  # fused: value i has code i // 32


def _assert_matches(got, want, min_codes_equal: float = 0.99):
    (xo, codes, lse), (xo_ref, codes_ref, lse_ref) = got, want
    assert torch.isfinite(xo).all()
    same = codes == codes_ref
    assert same.float().mean() >= min_codes_equal, (
        f"codes equal in {same.float().mean():.4f} of groups"
    )
    # Where the codes agree, values are at most one e4m3 step apart (a bf16 o off by one ulp).
    step = torch.maximum(xo_ref.abs() / 8, e8m0_scale(codes_ref).repeat_interleave(32, -1) / 512)
    close = (xo - xo_ref).abs() <= step
    assert close[same.repeat_interleave(32, -1)].all()
    assert (xo - xo_ref).norm() <= 1e-2 * xo_ref.norm()
    assert torch.equal(torch.isinf(lse), torch.isinf(lse_ref))
    fin = torch.isfinite(lse_ref)
    torch.testing.assert_close(lse[fin], lse_ref[fin], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("tokens", [1, 5])
def test_matches_reference_step(fmt, tokens):
    layer, sc, seams, q_fused = _step(2, COMPRESSED_LAYER, tokens, fmt)
    want = (*_fused(seams.xo, layer.dims.model.heads_per_group), seams.lse)
    got = _run(layer, sc, q_fused)
    _assert_matches(got, want)
    # Token 0 is shorter than the window (position 3: 4 keys); it still attends.
    assert int(sc.positions[0]) < layer.dims.model.window
    assert torch.isfinite(got[2][0]).all() and got[0][0].abs().sum() > 0


@pytest.mark.parametrize("fmt", FORMATS)
def test_matches_reference_step_48_tokens(fmt):
    layer, sc, seams, q_fused = _step(2, COMPRESSED_LAYER, 48, fmt)
    want = (*_fused(seams.xo, layer.dims.model.heads_per_group), seams.lse)
    _assert_matches(_run(layer, sc, q_fused), want)


@pytest.mark.parametrize(("tp", "fmt"), [(1, "fp8_mx"), (4, "fp8_ds_mla")])
def test_window_layer_other_head_counts(tp, fmt):
    """No compressed cache; 32 heads (two head tiles) and 8 heads (a half-masked tile)."""
    layer, sc, seams, q_fused = _step(tp, WINDOW_LAYER, 3, fmt)
    assert sc.compressed_cache is None
    want = (*_fused(seams.xo, layer.dims.model.heads_per_group), seams.lse)
    _assert_matches(_run(layer, sc, q_fused), want)


@pytest.mark.parametrize("splits", [1, 3])
def test_splits_agree(splits):
    """One program a (token, tile) and a split combined by the last arriver give the reference."""
    layer, sc, seams, q_fused = _step(2, COMPRESSED_LAYER, 5, "fp8_mx")
    want = (*_fused(seams.xo, layer.dims.model.heads_per_group), seams.lse)
    _assert_matches(_run(layer, sc, q_fused, splits=splits), want)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_early_keys_give_the_same_bits(fmt):
    """Splits of one key block reading their keys before the PDL wait (the caches ready) give
    the bits of the default order; any other split count or caches not ready run the default
    order."""
    layer, sc, seams, q_fused = _step(2, COMPRESSED_LAYER, 3, fmt)
    m = layer.dims.model
    cos, sin = rope_tables(m, layer.layer_id)
    blocks = -(-sc.key_table.shape[1] // KEY_BLOCK)

    def run(splits, ready):
        return mega_attention(
            q_fused, sc.positions, sc.key_table, sc.window_cache, sc.compressed_cache,
            layer.attn_sink, cos, sin, softmax_scale=m.softmax_scale,
            heads_per_group=m.heads_per_group, splits=splits, records_ready=ready,
        )  # fmt: skip

    default = run(blocks, False)
    for got, want in zip(run(blocks, True), default):
        assert torch.equal(got, want)
    _assert_matches(_run(layer, sc, q_fused, splits=blocks),
                    (*_fused(seams.xo, m.heads_per_group), seams.lse))  # fmt: skip
    for got, want in zip(run(2, True), run(2, False)):  # two blocks a split: not early
        assert torch.equal(got, want)


@pytest.mark.parametrize("fmt", FORMATS)
def test_empty_row_and_out_of_range_entries(fmt):
    layer, sc, seams, q_fused = _step(2, COMPRESSED_LAYER, 5, fmt)
    table = sc.key_table.clone()
    table[1] = NONE  # no key at all: zeros out, lse -inf
    win_n, comp_n = sc.window_cache.num_slots, sc.compressed_cache.num_slots
    bad = {(2, 0): comp_n | COMPRESSED_FLAG, (2, 5): win_n, (3, 1): win_n + 1000,
           (4, 2): (comp_n + 7) | COMPRESSED_FLAG, (4, 40): 2**31 - 1}  # fmt: skip
    as_none = table.clone()
    for (t, k), entry in bad.items():
        assert as_none[t, k] != NONE
        table[t, k] = entry - (1 << 32) if entry >= COMPRESSED_FLAG else entry
        as_none[t, k] = NONE
    got = _run(layer, sc, q_fused, key_table=table)
    _assert_matches(got, _expected(layer, sc, seams, as_none, layer.attn_sink))
    assert torch.equal(got[0][1], torch.zeros_like(got[0][1]))
    assert torch.isneginf(got[2][1]).all()


@pytest.mark.parametrize("heads", [pytest.param(1, marks=pytest.mark.slow), 16])
def test_combine_heads_a_program(heads):
    """``AttentionTuning.combine_heads``: combine programs of 1 or 16 heads (4 by default) give
    the reference, in both combine orders; other values are refused."""
    assert attention_tuning(1, 16, 640, 132).combine_heads == 4 and combine_programs(4) == 64
    layer, sc, seams, q_fused = _step(2, COMPRESSED_LAYER, 3, "fp8_ds_mla")
    want = (*_fused(seams.xo, layer.dims.model.heads_per_group), seams.lse)
    for wide in (False, True):
        _assert_matches(_run(layer, sc, q_fused, splits=3, combine_heads=heads,
                             combine_wide=wide), want)  # fmt: skip
    with pytest.raises(ValueError, match="AttentionTuning.combine_heads: expected 1, 2, 4, 8"):
        dataclasses.replace(attention_tuning(1, 16, 640, 132), combine_heads=3)


@pytest.mark.parametrize("fmt", FORMATS)
def test_key_blocks_of_32_keys(fmt):
    """``AttentionTuning.key_block``: dots of 32 keys give the reference in two splits of 48
    keys (each split's last block stops at its end: the next split's keys are not taken
    twice), in splits of whole blocks and in one; another block size is refused."""
    layer, sc, seams, q_fused = _step(2, COMPRESSED_LAYER, 3, fmt)
    want = (*_fused(seams.xo, layer.dims.model.heads_per_group), seams.lse)
    keys = sc.key_table.shape[1]
    for splits, per in ((-(-keys // 48), 48), (2, -(-keys // 64) * 32), (1, -(-keys // 32) * 32)):
        _assert_matches(_run(layer, sc, q_fused, splits=splits, key_block=32,
                             keys_per_split=per), want)  # fmt: skip
    with pytest.raises(ValueError, match=r"AttentionTuning.key_block: expected one of \(16, 32\)"):
        dataclasses.replace(attention_tuning(1, 16, 640, 132), key_block=64)


@pytest.mark.parametrize("fmt", FORMATS)
def test_keys_as_the_a_operand(fmt):
    """``AttentionTuning.keys_a`` (scores ``[keys, heads]``, the output transposed): the
    reference and the default's xo bit for bit, lse within fp32 summation order, with 16- and
    32-key dots, whole and segmented score dots, split and not."""
    layer, sc, seams, q_fused = _step(2, COMPRESSED_LAYER, 3, fmt)
    want = (*_fused(seams.xo, layer.dims.model.heads_per_group), seams.lse)
    keys = sc.key_table.shape[1]
    for key_block, qk_split, splits in ((16, 1, 3), (32, 4, 1), (32, 2, 2)):
        per = -(-keys // (splits * key_block)) * key_block
        change = {"key_block": key_block, "qk_split": qk_split, "keys_per_split": per}
        got = _run(layer, sc, q_fused, splits=splits, keys_a=True, **change)
        _assert_matches(got, want)
        plain = _run(layer, sc, q_fused, splits=splits, **change)
        assert torch.equal(got[0], plain[0]) and torch.equal(got[1], plain[1])
        torch.testing.assert_close(got[2], plain[2], rtol=0, atol=2e-6)


@pytest.mark.parametrize("wide,splits", [(False, 3), pytest.param(True, 3, marks=pytest.mark.slow),
                                         pytest.param(True, 4, marks=pytest.mark.slow)])
def test_combine_split_by_split_or_all_at_once(wide, splits):
    """Both combine orders (``AttentionTuning.combine_wide``: split by split, or every split's
    partials in one load) give the reference, with a row of no keys (zeros, lse -inf) and split counts
    of no power of two (all at once: read as a power of two and the rest) and of one; by
    default all at once from ``COMBINE_WIDE_SPLITS`` splits on."""
    assert split_pieces(40) == {"SPLIT_HEAD": 32, "SPLIT_TAIL": 8}  # tp 4, M = 1: no padding
    assert split_pieces(32) == {"SPLIT_HEAD": 32, "SPLIT_TAIL": 0}
    assert split_pieces(7) == {"SPLIT_HEAD": 4, "SPLIT_TAIL": 4}  # one padded row
    assert split_pieces(1) == {"SPLIT_HEAD": 1, "SPLIT_TAIL": 0}
    assert combine_wide(COMBINE_WIDE_SPLITS) and not combine_wide(COMBINE_WIDE_SPLITS - 1)
    layer, sc, seams, q_fused = _step(2, COMPRESSED_LAYER, 5, "fp8_mx")
    table = sc.key_table.clone()
    table[2] = NONE
    got = _run(layer, sc, q_fused, key_table=table, splits=splits, combine_wide=wide)
    _assert_matches(got, _expected(layer, sc, seams, table, layer.attn_sink))
    assert torch.equal(got[0][2], torch.zeros_like(got[0][2])) and torch.isneginf(got[2][2]).all()


@pytest.mark.slow
def test_infinite_sink_zeroes_heads():
    layer, sc, seams, q_fused = _step(2, COMPRESSED_LAYER, 5, "fp8_ds_mla")
    sink = layer.attn_sink.clone()
    sink[::3] = float("inf")
    sink[1] = -float("inf")  # no sink: plain softmax
    got = _run(layer, sc, q_fused, sink=sink)
    _assert_matches(got, _expected(layer, sc, seams, sc.key_table, sink))
    chunks = got[0].view(5, -1, 32)  # fused: chunk g * 128 + c * 8 + e is head g * 8 + e
    k = torch.arange(chunks.shape[1])
    head = k // 128 * 8 + k % 8
    assert torch.equal(chunks[:, head % 3 == 0], torch.zeros_like(chunks[:, head % 3 == 0]))
    assert (chunks[:, head == 1].abs().sum(-1) > 0).all()


def test_expected_pieces_are_the_reference_step():
    """The composed reference the variants use equals reference_step on the unchanged inputs."""
    layer, sc, seams, _ = _step(2, COMPRESSED_LAYER, 5, "fp8_ds_mla")
    xo, codes, lse = _expected(layer, sc, seams, sc.key_table, layer.attn_sink)
    want_xo, want_codes = _fused(seams.xo, layer.dims.model.heads_per_group)
    assert (
        torch.equal(xo, want_xo) and torch.equal(codes, want_codes) and torch.equal(lse, seams.lse)
    )


def test_bad_arguments_are_named():
    layer, sc, _, q_fused = _step(2, COMPRESSED_LAYER, 1, "fp8_ds_mla")
    m = layer.dims.model
    cos, sin = rope_tables(m, layer.layer_id)
    args = {
        "q_fused": q_fused, "positions": sc.positions, "key_table": sc.key_table,
        "window_cache": sc.window_cache, "compressed_cache": sc.compressed_cache,
        "attn_sink": layer.attn_sink, "cos": cos, "sin": sin,
    }  # fmt: skip

    def call(**change):
        return mega_attention(**{**args, **change}, softmax_scale=m.softmax_scale)

    with pytest.raises(ValueError, match=r"q_fused: expected bfloat16 \[1, 8192\], got float32"):
        call(q_fused=q_fused.float())
    with pytest.raises(ValueError, match="key_table: expected int32"):
        call(key_table=sc.key_table.long())
    with pytest.raises(ValueError, match=r"attn_sink: expected float32 \[16\]"):
        call(attn_sink=layer.attn_sink[:8].contiguous())
    with pytest.raises(ValueError, match="positions: expected int32 or int64"):
        call(positions=sc.positions.float())
    other = make_scenario(layer.dims, COMPRESSED_LAYER, 1, fmt="fp8_mx").compressed_cache
    with pytest.raises(
        ValueError, match="compressed_cache: expected the window cache's record format"
    ):
        call(compressed_cache=other)
    with pytest.raises(ValueError, match="splits: expected"):
        mega_attention(**args, softmax_scale=m.softmax_scale, splits=0)


def test_rows_aligned_needs_aligned_bases_and_even_ds_mla_pages() -> None:
    """The 16-B row hint holds for 16-B aligned caches with ds_mla pages of an even number of
    records (584 B each) or any fp8_mx page (528-B records), and only then."""
    even, odd = PagedKVCache(2, 16, "fp8_ds_mla"), PagedKVCache(2, 3, "fp8_ds_mla")
    mx_odd = PagedKVCache(2, 3, "fp8_mx")
    assert rows_aligned(even) and rows_aligned(mx_odd) and rows_aligned(even, mx_odd)
    assert not rows_aligned(odd) and not rows_aligned(even, odd)
    shifted = PagedKVCache(2, 16, "fp8_ds_mla")
    shifted.data = torch.zeros(2 * 16 * 584 + 8, dtype=torch.uint8)[8:].view(2, 16 * 584)
    assert not rows_aligned(shifted)


@pytest.mark.parametrize("heads", [16, 32])
def test_splits_fill_the_gpu_in_whole_key_blocks(heads) -> None:
    """The flash geometry's 640 keys on 132 SMs: each token bucket's splits cover the keys in
    whole blocks, at most the programs a SM wanted (one wave; or one split a block), with the
    fewest keys a split that allows: one block less a split would need more splits than wanted.
    Another count of programs a SM can be asked for."""
    keys, sms, blocks = 640, 132, 640 // KEY_BLOCK

    def check(tokens: int, per_sm: int, forced: int | None = None) -> int:
        tiles = tokens * heads // 16
        wanted = min(blocks, max(1, per_sm * sms // tiles))
        splits, per_split = attention_splits(tokens, heads, keys, sms, forced)
        assert tiles * splits <= max(per_sm * sms, tiles), (tokens, splits)  # one wave
        assert per_split % KEY_BLOCK == 0 and (splits - 1) * per_split < keys <= splits * per_split
        assert splits <= wanted, (tokens, splits, wanted)
        assert per_split == KEY_BLOCK or -(-keys // (per_split - KEY_BLOCK)) > wanted, tokens
        return splits

    # 1 program a SM up to 16 tiles, 2 up to 64, 3 above (the H200 measurements in the module)
    tiers = ((16, 1), (64, 2), (10**9, 3))
    got = [check(t, next(p for most, p in tiers if t * heads // 16 <= most))
           for t in (1, 2, 4, 8, 16, 32, 48)]  # fmt: skip
    assert got[0] == blocks, got
    assert check(16, 4, forced=4) > got[4]


def test_record_prefetch_needs_inline_ptx(monkeypatch) -> None:
    """The L2 prefetch of a split's records is inline PTX: off under the interpreter and on ROCm,
    on on an NVIDIA GPU (the GPU test checks that it changes no bit)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not prefetch_records()
    with targeting(parse_target("sm90")):
        assert prefetch_records()
    with targeting(parse_target("gfx950")):
        assert not prefetch_records()


# The attention kernel compiled for SM90 in a script (``ptx_facts``): the real geometry's
# constexprs, a script's own in ``over``, and the arguments' types.
SM90_ATTENTION = r"""
import json, re, sys
from sm90 import sm90_ptx
from dsv41.nvidia.ops.mega_attention import mega_attention_kernel as fn
def attention_ptx(options=None, **over):
    consts = dict(H=16, G=8, KEYS=640, FMT=0, WIN_BLOCK=32, COMP_BLOCK=64, HT=16, BK=16,
                  KEYS_PER_SPLIT=80, SPLITS=8, DOT_BF16=True, USE_PDL=False, EARLY=False,
                  ALIGNED=True, PREFETCH=False, SPLIT_PAD=128, QK_SPLIT=4, TRACE=False)
    kinds = {"q_ptr": "*bf16", "pos_ptr": "*i64", "table_ptr": "*i32", "sink_ptr": "*fp32",
             "cos_ptr": "*fp32", "sin_ptr": "*fp32", "lse_ptr": "*fp32", "part_o_ptr": "*fp32",
             "part_stat_ptr": "*fp32", "qk_scale": "fp32", "trace_ptr": "*i64"}
    return sm90_ptx(fn, {**consts, **over}, kinds, num_warps=4, **(options or {}))
"""

SM90_PREFETCH = SM90_ATTENTION + r"""
ptx = attention_ptx(FMT=int(sys.argv[1]), PREFETCH=sys.argv[2] == "1")
first_record = ptx.find("ld.global.v4")
print(json.dumps({
    "bulk": len(re.findall(r"@p cp\.async\.bulk\.prefetch\.L2\.global \[%rd\d+\], (\d+)", ptx)),
    "size": re.findall(r"cp\.async\.bulk\.prefetch\.L2\.global \[%rd\d+\], (\d+)", ptx),
    "line": len(re.findall(r"@p prefetch\.global\.L2", ptx)),
    "before_records": 0 <= ptx.find("cp.async.bulk.prefetch") < first_record}))
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU tests compile for the real device")
@pytest.mark.parametrize("fmt", FORMATS)
def test_record_prefetch_compiles_for_sm90(fmt):
    """An 80-key split compiled for SM90 without a GPU (ptxas checks the PTX): with PREFETCH one
    predicated bulk L2 prefetch of the record's bytes (576 data bytes and the scale row's line
    for fp8_ds_mla, the whole 528-B fp8_mx record), issued before the first record load;
    none without it."""
    counts = {p: ptx_facts(SM90_PREFETCH, str(FORMATS.index(fmt)), p) for p in ("1", "0")}
    on, off = counts["1"], counts["0"]
    assert on["bulk"] == 1 and on["before_records"], on
    assert on["size"] == (["576"] if fmt == "fp8_ds_mla" else ["528"]), on
    assert on["line"] == (1 if fmt == "fp8_ds_mla" else 0), on
    assert off["bulk"] == 0 and off["line"] == 0, off


SM90_CAP = SM90_ATTENTION + r"""
from dsv41.common.platform import parse_target, targeting
from dsv41.nvidia.ops.mega_attention import register_cap
with targeting(parse_target("sm90")):
    cap = register_cap(168)
ptx = attention_ptx(options=cap)
print(json.dumps({"cap": cap, "maxnreg": re.findall(r"\.maxnreg (\d+)", ptx)}))
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU tests compile for the real device")
def test_register_cap_reaches_the_sm90_code():
    """``AttentionTuning.max_registers``: on SM90 the launch option ``maxnreg``, which the
    compiled code declares; no option on ROCm or under the interpreter; out of range refused."""
    got = ptx_facts(SM90_CAP)
    assert got == {"cap": {"maxnreg": 168}, "maxnreg": ["168"]}, got
    with targeting(parse_target("gfx950")):
        assert register_cap(168) == {}
    assert register_cap(0) == {}
    with pytest.raises(ValueError, match=r"AttentionTuning.max_registers: expected 0 or 64"):
        dataclasses.replace(attention_tuning(1, 16, 640, 132), max_registers=32)


SM90_TRACE = SM90_ATTENTION + r"""
ptx = attention_ptx(KEYS_PER_SPLIT=16, SPLITS=40, USE_PDL=True, EARLY=True, SPLIT_PAD=16,
                    TRACE=True)
after = ptx[ptx.find("griddepcontrol.wait"):]
print(json.dumps({"timer": len(re.findall(r"%globaltimer", ptx)),
                  "clock": len(re.findall(r"%clock64", ptx)),
                  "clock_after_wait": len(re.findall(r"%clock64", after))}))
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU tests compile for the real device")
def test_trace_reads_both_clocks_on_sm90():
    """The traced attention program (``profile_step.py --attn-trace``), one early key block,
    compiled for SM90 without a GPU: each of its 7 stamps reads %globaltimer and %clock64, and
    q's raw load one more %clock64; 6 of the cycle counts come after the PDL wait (the wait,
    q loaded, q ready, the scores, the loop, the end)."""
    got = ptx_facts(SM90_TRACE)
    assert got == {"timer": 7, "clock": 8, "clock_after_wait": 6}, got


@pytest.mark.slow
@pytest.mark.parametrize("segments", [1, 2, 8])
def test_score_dot_in_segments_matches_the_reference(segments) -> None:
    """The score dot cut into segments of the 512 dims (``AttentionTuning.qk_split``; by default
    4 up to 16 (token, head tile) pairs, 1 above, as measured), split keys and one split: the
    reference's seams; a count other than 1, 2, 4 or 8 is refused."""
    assert [score_segments(t) for t in (1, 16, 17, 96)] == [4, 4, 1, 1]
    layer, sc, seams, q_fused = _step(2, COMPRESSED_LAYER, 5, "fp8_ds_mla")
    want = (*_fused(seams.xo, layer.dims.model.heads_per_group), seams.lse)
    for splits in (1, 3):
        _assert_matches(_run(layer, sc, q_fused, splits=splits, qk_split=segments), want)
    with pytest.raises(ValueError, match="AttentionTuning.qk_split: expected 1, 2, 4 or 8"):
        _run(layer, sc, q_fused, splits=1, qk_split=3)
