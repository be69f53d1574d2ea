"""The NVIDIA step against reference_step, seam by seam (tiny geometry, interpreter on CPU).

Seams: qkv, kv (and the window cache bytes), q (fused, before RoPE) against
``mx_linear(mxfp8(qr), Wq_b)`` of the reference's qr, xo (fused values and codes)
against the reference's standard xo put through the O permutation, lse, z, z8
and y. Scenarios always hold a sequence shorter than the window (position 3),
a token with no compressed key and one with a full top-k; one test adds -1
and out-of-cache entries to the key table. M = 48 runs once (fp8_mx), the
smaller M with both record formats.
"""

import dataclasses

import pytest
import torch

from dsv41.common.fused_layout import permute_o_to_fused
from dsv41.common.geometry import Dims
from dsv41.common.kv_cache import COMPRESSED_FLAG
from dsv41.common.mx import mxfp8_dequantize, mxfp8_quantize, mxfp8_round
from dsv41.common.reference import mx_linear, reference_step
from dsv41.common.scenario import make_scenario
from dsv41.common.weights import LayerWeights
from dsv41.nvidia.ops.mx_gemm import GemvRules, Scratch, gemm_config
from dsv41.nvidia.step import STEP_SEAMS, NvidiaStepRunner, StepBuffers, launch_step, nvidia_step
from dsv41.nvidia.tuning import GEMM_SITES, changed, gemm_shapes, resolve, tuning_for
from dsv41.nvidia.warmup import REGISTRY, warmup

LAYER_ID = 1  # compressed: window + top-k


@pytest.fixture(scope="module")
def layer() -> LayerWeights:
    lw = LayerWeights(Dims.of("tiny", 2), rank=1, layer_id=LAYER_ID)
    lw.dummy_load(seed=3)
    return lw


def run_both(layer, sc, tuning=None):
    a, b = sc.clone_caches(), sc.clone_caches()
    ref = reference_step(layer, a)
    got = nvidia_step(layer, b, tuning=tuning)
    return ref, got, a.window_cache, b.window_cache


def rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm())


def check_seams(layer, ref, got, ref_cache, got_cache) -> None:
    model = layer.dims.model
    m = ref.y.shape[0]
    assert set(got) == set(STEP_SEAMS)
    assert torch.equal(got["qkv"], ref.qkv)
    assert torch.equal(got["kv"], ref.kv)  # measured equal at this layer
    assert torch.equal(got_cache.data, ref_cache.data)
    # q equal but where an fp32 sum lands on the other side of a bf16 tie from torch's (the
    # CPU's order decides: one value of 393,216 at M 48, fp8_mx, on an AMD EPYC, rel 3.8e-10)
    assert rel(got["q"], mx_linear(mxfp8_quantize(ref.qr), layer.wq_b, layer.wq_b_scale)) < 1e-8
    xo_values, xo_codes = got["xo"]
    codes32 = ref.xo[1].repeat_interleave(32, -1)
    want_codes = permute_o_to_fused(codes32, model.heads_per_group).flatten(-2)[:, ::32]
    assert torch.equal(xo_codes, want_codes)  # measured all equal
    want_xo = permute_o_to_fused(ref.xo[0].float(), model.heads_per_group).flatten(-2)
    assert rel(xo_values.float(), want_xo) < 6e-4  # measured <= 2.7e-4 (ds_mla, M 5)
    finite = torch.isfinite(ref.lse)
    assert torch.equal(torch.isfinite(got["lse"]), finite)
    torch.testing.assert_close(got["lse"][finite], ref.lse[finite], rtol=0, atol=2e-6)  # 4.8e-7
    assert rel(got["z"], ref.z.reshape(m, -1)) < 1.5e-3  # measured <= 2.1e-4 (ds_mla, M 5)
    want_z8 = mxfp8_quantize(got["z"])
    assert torch.equal(got["z8"][1], want_z8[1])
    assert torch.equal(got["z8"][0].view(torch.uint8), want_z8[0].view(torch.uint8))
    assert rel(got["y"], ref.y) < 3e-3  # measured <= 2.3e-4 (fp8_mx, M 48)


@pytest.mark.parametrize(
    "fmt,m",
    [("fp8_ds_mla", 1), pytest.param("fp8_ds_mla", 2, marks=pytest.mark.slow), ("fp8_ds_mla", 5),
     pytest.param("fp8_mx", 1, marks=pytest.mark.slow), ("fp8_mx", 5),
     pytest.param("fp8_mx", 48, marks=pytest.mark.slow)],
)
def test_step_matches_reference(layer, fmt, m):
    """M = 1 and 2 take the CUDA-core GEMV loop (wq_b normalising qr itself; at M = 1 z cast
    to MXFP8 in wo_b's prologue), 5 and 48 the MMA loop."""
    sc = make_scenario(layer.dims, LAYER_ID, m, fmt=fmt, seed=m)
    check_seams(layer, *run_both(layer, sc))


@pytest.mark.parametrize("change", ["z_cast", "no_tail"])
def test_one_token_step_with_z_cast_in_wo_a(layer, change):
    """One token with z cast in wo_a's epilogue and wo_b on z8, as two tokens run: z's cast in
    wo_b turned off, or one token's whole-row rule off (without which wo_a splits K)."""
    cpu = torch.device("cpu")
    if change == "z_cast":
        n, k, npg, _ = gemm_shapes(layer.dims)["wo_a"]
        wo_a = gemm_config(1, n, k, n_per_group=npg, quant_out=True, sms=8)  # an MX epilogue
        tuning = dataclasses.replace(tuning_for(layer.dims, cpu, 1), z_cast_in_wo_b=False,
                                     wo_a=wo_a)  # fmt: skip
    else:
        tuning = resolve(layer.dims, 8, 1, rules=GemvRules(tail=0))
    assert not tuning.z_cast_in_wo_b and tuning.wo_a.gemv
    sc = make_scenario(layer.dims, LAYER_ID, 1, fmt="fp8_ds_mla", seed=21)
    check_seams(layer, *run_both(layer, sc, tuning))


def test_z_cast_in_wo_b_follows_whole_wo_a_rows(layer):
    """One token casts z in wo_b (wo_a then takes whole rows); two tokens and 48 do not (wo_a
    splits K there, so its epilogue casts whole MX blocks)."""
    cpu = torch.device("cpu")
    assert tuning_for(layer.dims, cpu, 1).z_cast_in_wo_b
    assert not tuning_for(layer.dims, cpu, 2).z_cast_in_wo_b
    assert not tuning_for(layer.dims, cpu, 48).z_cast_in_wo_b


@pytest.mark.parametrize("fmt", ["fp8_ds_mla", "fp8_mx"])
def test_none_and_out_of_cache_entries_are_no_key(layer, fmt):
    sc = make_scenario(layer.dims, LAYER_ID, 3, fmt=fmt, seed=9)
    table = sc.key_table.clone()
    table[0, 1] = -1
    table[1, 0] = sc.window_cache.num_slots + 5  # window slot past the cache
    # A compressed row past its cache: slot | 1 << 31, as int32 bits.
    table[1, -1] = (sc.compressed_cache.num_slots + 2) - COMPRESSED_FLAG
    table[2, 2] = sc.window_cache.num_slots  # the first slot past the cache
    sc = dataclasses.replace(sc, key_table=table)
    check_seams(layer, *run_both(layer, sc))


@pytest.mark.slow
def test_runner_writes_preallocated_buffers(layer):
    """The runner's eager step (what a graph captures) gives nvidia_step's seams in its buffers."""
    sc = make_scenario(layer.dims, LAYER_ID, 2, fmt="fp8_mx", seed=4)
    runner = NvidiaStepRunner(layer, max_tokens=4)
    a, b = sc.clone_caches(), sc.clone_caches()
    m = runner.load(a)
    got = runner.run(m, a.window_cache, a.compressed_cache)
    want = nvidia_step(layer, b)
    assert got["y"].data_ptr() == runner.buffers.y.data_ptr()
    for name in ("qkv", "q", "z", "y"):
        assert torch.equal(got[name], want[name]), name
    with pytest.raises(ValueError, match=r"x: expected 1 <= M <= max_tokens = 4, got 5"):
        runner.load(dataclasses.replace(sc, x=torch.zeros(5, layer.dims.model.hidden,
                                                          dtype=torch.bfloat16)))


@pytest.mark.slow
def test_warmup_runs_each_entry_point_for_a_bucket(layer):
    seconds = warmup(layer, [2], fmt="fp8_mx")
    assert set(seconds) == {(v.name, 2) for v in REGISTRY if v.serves(layer, 2)}
    with pytest.raises(ValueError, match=r"buckets: expected values from .*, got 3"):
        warmup(layer, [3])  # not a bucket


def test_bad_inputs_name_the_argument(layer):
    sc = make_scenario(layer.dims, LAYER_ID, 2, seed=0)
    for name, bad, message in [
        ("x", sc.x.float(), r"x: expected bfloat16 \[M, \d+\], got torch.float32"),
        ("key_table", sc.key_table.long(), r"key_table: expected int32 \[2, KEYS\], got torch.int64"),
        ("positions", sc.positions[:1], r"positions: expected int32 or int64 \[2\], got"),
    ]:
        with pytest.raises(ValueError, match=message):
            nvidia_step(layer, dataclasses.replace(sc, **{name: bad}))


def test_norm_in_wq_b_follows_the_cuda_core_loop(layer):
    """One and two tokens: wq_b's CUDA-core loop normalises qr itself; a 48-token bucket takes
    the MMA loop and the norm kernel."""
    cpu = torch.device("cpu")
    t1, t48 = tuning_for(layer.dims, cpu, 1), tuning_for(layer.dims, cpu, 48)
    assert t1.norm_in_wq_b and t1.wq_b.gemv and not t48.norm_in_wq_b and not t48.wq_b.gemv


@pytest.mark.parametrize("field", ["code_words", "weights_a"])
def test_mma_loop_choices_change_no_bit(layer, field):
    """``GemmConfig.code_words`` (the weight codes read as words) and ``weights_a`` (the weights
    the A operand) at every MMA site: every seam of the default step bit for bit, in both
    record formats."""
    cpu = torch.device("cpu")
    base = tuning_for(layer.dims, cpu, 5)
    words = changed(base, {f"{site}.{field}": True for site in GEMM_SITES})
    for fmt in ("fp8_ds_mla", "fp8_mx"):
        sc = make_scenario(layer.dims, LAYER_ID, 5, fmt=fmt, seed=35)
        runs = [nvidia_step(layer, sc.clone_caches(), tuning=t) for t in (base, words)]
        for name in STEP_SEAMS:
            pairs = zip(*(s if isinstance(s, tuple) else (s,) for s in (r[name] for r in runs)))
            for a, b in pairs:
                assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), (fmt, name)


def test_dequantized_activations_are_the_mxfp8_round_trips(layer):
    """At an MMA bucket every GEMM reads its activation dequantized by its producer: each
    buffer is the torch MXFP8 round trip of what it stands for (x; the qr8, xo and z8 seams),
    exact in bf16 (its GEMM's bits against the MXFP8 operand: test_gemms.py)."""
    cpu = torch.device("cpu")
    m = 5
    tuning = tuning_for(layer.dims, cpu, m)
    assert all(tuning.dequantized(site) for site in GEMM_SITES)
    assert not any(tuning_for(layer.dims, cpu, 1).dequantized(site) for site in GEMM_SITES)
    sc = make_scenario(layer.dims, LAYER_ID, m, fmt="fp8_mx", seed=31)
    out = StepBuffers.allocate(layer, m, cpu)
    scratch = {site: Scratch() for site in GEMM_SITES}
    seams = launch_step(layer, sc.clone_caches(), out, scratch, tuning)
    fused = mxfp8_dequantize(*seams["xo"])
    want = {"xd": mxfp8_round(sc.x), "qrd": mxfp8_dequantize(*out.qr8), "xod": fused,
            "zd": mxfp8_dequantize(*seams["z8"])}  # fmt: skip
    for name, value in want.items():
        assert torch.equal(getattr(out, name), value.to(torch.bfloat16)), name
    assert torch.equal(fused.to(torch.bfloat16).float(), fused)  # exact in bf16
