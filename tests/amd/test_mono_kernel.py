"""The mono kernel (Triton interpreter on CPU, tiny geometry) against the schedule executor,
region by region, and against the reference step."""

from __future__ import annotations

import pytest
import torch

from dsv41.amd.mono.checks import parity, region_agreement
from dsv41.amd.mono.executor import ScheduleExecutor
from dsv41.amd.mono.launcher import MonoRunner
from dsv41.amd.mono.plan import CTL_EPOCH, DEQUANTIZED
from dsv41.amd.mono.tuning import resolve
from dsv41.common.mx import mxfp8_dequantize
from dsv41.common.platform import Platform
from dsv41.common.rope import rope_tables
from dsv41.common.scenario import make_scenario

MAILBOXES = ("ctl", "xrdy", "qrdy", "srdy", "crdy", "ardy", "wrdy")
# What the kernel achieves against the schedule executor and the reference, measured over every
# case in this file (slow ones too) on CPU, 2026-12-04; bounds about 3x the worst, exact where
# every case was exact. The mailboxes, x8 and the window cache equal bit for bit, and y equals
# the executor's in every case (the differences below never reach it).
BIT_EXACT = ("x8", "x8s", "qx8", "qx8s", "xos", "x8bs")  # x8 unrounded; the others all equal
# fp32 sums in another order: the worst |difference| measured 2.4e-7 (qkvp), 1.1e-6 (part),
# 5.7e-6 (pstat)
ACCUMULATED = {"qkvp": 7.2e-7, "part": 3.3e-6, "pstat": 1.8e-5}
# values of those sums' roundings that may differ: a value on the other side of a tie. Measured
# at most 8.1e-5 of q (ROCm tiles, tp 4, layer 2, M 3), 5.2e-5 of xo, 1.1e-3 of x8b (tp 2,
# layer 2, M 7)
QUANTIZED = {"q": 2.5e-4, "xo": 1.6e-4, "x8b": 3.4e-3}
# sums over xo (the bf16 z of 4096 terms, its fp32 K parts), rel L2: xo's few flips move them
# by at most 2.0e-4 (z) and 1.1e-4 (woap), tp 2, layer 2, M 7
LONG_SUMS = {"z": 5.9e-4, "woap": 3.4e-4}
# y against the executor's where x8b's roundings differ (else bit for bit): rel L2 1.4e-3 with
# 1.5e-3 of x8b flipped (tensor-core blocks in 4 K segments, tp 2, layer 0, M 48, AMD EPYC)
Y_AFTER_FLIPS = 4.3e-3
# against the reference: E8M0 codes all equal; y rel L2 at most 1.4e-3 and z 2.7e-4 (tp 2,
# layer 0, M 48: the executor's own figures, test_mono_plan.py), 0 below M 48; q 4.3e-9 (ROCm
# tiles, one value), else 0
REFERENCE = {"y_rel": 4.3e-3, "z_rel": 8.1e-4, "q_rel": 1.4e-8}


def assert_near_reference(got: dict) -> None:
    """``parity``'s figures within ``REFERENCE``, every E8M0 code equal."""
    assert got["xo_codes"] == 1.0 and got["z_codes"] == 1.0, got
    assert all(got[k] <= bound for k, bound in REFERENCE.items()), got


@pytest.mark.parametrize(
    "tp, layer_id, tokens, hidden, cores, woa_parts, words",
    # both shares, all three layer kinds, S = 1, 7, 48; hidden 512: x in 4 xq blocks; the GEMV
    # blocks on tensor cores, and on CUDA cores (Tuning.gemv_cores) at S = 1 and 7, at S = 1
    # and 3 (4 token rows, one dead) also on weights held as words (Tuning.gemv_words); wo_a
    # in 1, 2 and 4 K parts (Tuning.woa_parts)
    [(4, 1, 1, 512, False, 4, False),
     pytest.param(2, 2, 7, 256, False, 1, False, marks=pytest.mark.slow),
     pytest.param(4, 0, 48, 256, False, 4, False, marks=pytest.mark.slow),
     (4, 1, 1, 512, True, 4, False),
     pytest.param(2, 2, 7, 256, True, 2, False, marks=pytest.mark.slow),
     (4, 1, 1, 512, True, 4, True), (2, 2, 1, 256, True, 2, True), (4, 2, 3, 256, True, 2, True)],
)
def test_kernel_matches_executor_and_reference(
    tp: int, layer_id: int, tokens: int, hidden: int, cores: bool, woa_parts: int, words: bool,
    tiny_layer, run_mono, run_reference,
) -> None:
    tuning = {"gemv_cores": cores, "woa_parts": woa_parts, "gemv_words": words}
    _against_executor_and_reference(tp, layer_id, tokens, hidden, tiny_layer, run_mono,
                                    run_reference, tuning)  # fmt: skip


@pytest.mark.parametrize("tp, layer_id, pairs", [(4, 1, True), (2, 2, True), (4, 1, False)])
def test_pairs_match_executor_and_reference(
    tp: int, layer_id: int, pairs: bool, tiny_layer, run_mono, run_reference
) -> None:
    """One token's wq_b and wo_b tasks two at once (Tuning.gemv_pairs, on by default) or one at
    a time. The interpreter runs one program at a time, so each such task's next ticket is the
    next task of its stage; a next ticket held over to another stage happens on the GPU
    (tests/gpu/test_mono_gpu.py)."""
    runner = _against_executor_and_reference(tp, layer_id, 1, 256, tiny_layer, run_mono,
                                             run_reference, {"gemv_pairs": pairs})  # fmt: skip
    assert runner.plan.tiling["GEMV_PAIRS"] == pairs and runner.plan.tiling["GEMV_WORDS"]


@pytest.mark.parametrize("tp, layer_id, tokens",
                         [(4, 1, 7), pytest.param(2, 0, 48, marks=pytest.mark.slow)])
def test_mma_split_matches_executor_and_reference(
    tp: int, layer_id: int, tokens: int, tiny_layer, run_mono, run_reference
) -> None:
    """Tensor-core GEMV blocks cut into 4 K segments (Tuning.mma_split)."""
    tuning = {"gemv_cores": False, "mma_split": 4}
    runner = _against_executor_and_reference(tp, layer_id, tokens, 256, tiny_layer, run_mono,
                                             run_reference, tuning)  # fmt: skip
    assert runner.plan.tiling["MMA_SPLIT"] == 4


@pytest.mark.parametrize("tp, layer_id, tokens",
                         [(4, 1, 1), pytest.param(2, 2, 7, marks=pytest.mark.slow)])
def test_key_slices_match_executor_and_reference(
    tp: int, layer_id: int, tokens: int, tiny_layer, run_mono, run_reference
) -> None:
    """Attention tasks in two slices of 16 keys (Tuning.key_slice): the online softmax
    across slices, which the tiny geometry's one 32-key slice a chunk never runs."""
    runner = _against_executor_and_reference(tp, layer_id, tokens, 256, tiny_layer, run_mono,
                                             run_reference, {"key_slice": 16})  # fmt: skip
    assert (runner.plan.key_chunk, runner.plan.key_slice) == (32, 16)


@pytest.mark.parametrize("tp, layer_id, tokens, hidden",
                         [(4, 1, 1, 512), (4, 2, 3, 512),
                          pytest.param(2, 2, 7, 512, marks=pytest.mark.slow)])
def test_rocm_tuning_matches_executor_and_reference(
    tp: int, layer_id: int, tokens: int, hidden: int, tiny_layer, run_mono, run_reference
) -> None:
    """The tiles a ROCm node resolves (GEMV blocks of 128, 16-key slices, weight words at one
    token only, tensor-core blocks in 8 K segments) give the executor's scratch and the
    reference's y: x runs in two K blocks a Wqkv half, not one; 3 tokens on CUDA cores byte by
    byte; 7 on tensor cores in segments."""
    rocm = Platform("rocm", "gfx942")
    runner = _against_executor_and_reference(tp, layer_id, tokens, hidden, tiny_layer, run_mono,
                                             run_reference, {"platform": rocm})  # fmt: skip
    plan = runner.plan
    assert plan.tuning == resolve(plan.dims, tokens, platform=rocm) and plan.key_slice == 16
    assert plan.tiling["BK_X"] == 128 and plan.xq_blocks == 2
    assert plan.tiling["GEMV_WORDS"] == (tokens == 1)
    assert plan.tiling["MMA_SPLIT"] == (1 if tokens <= 4 else 8)


@pytest.mark.slow
@pytest.mark.parametrize("tokens", [1, 3])
def test_two_head_tiles_match_executor_and_reference(tokens: int, tiny_layer, run_mono,
                                                     run_reference) -> None:  # fmt: skip
    """64 heads at tp 2: 32 a rank, two attention head tiles (the real geometry's tp 2 share),
    so the second tile's q is read from the fused Q layout past the first's columns."""
    runner = _against_executor_and_reference(2, 1, tokens, 256, tiny_layer, run_mono,
                                             run_reference, heads=64)  # fmt: skip
    assert runner.plan.head_tiles == 2


def _against_executor_and_reference(
    tp: int, layer_id: int, tokens: int, hidden: int, tiny_layer, run_mono, run_reference,
    tuning: dict | None = None, **layer,
) -> MonoRunner:
    """Every scratch region of one launch against the schedule executor's, y against the
    reference (``tuning``: Tuning fields changed from the measured ones; ``layer``: more of
    ``tiny_layer``'s arguments)."""
    lw = tiny_layer(tp, layer_id, hidden, **layer)
    sc = make_scenario(lw.dims, layer_id, tokens, seed=tokens)
    kernel_sc, exec_sc = sc.clone_caches(), sc.clone_caches()
    runner = MonoRunner(lw, tokens, epoch=5, tuning=resolve(lw.dims, tokens, **(tuning or {})))
    seams = run_mono(runner, kernel_sc)

    plan = runner.plan
    scratch = plan.new_scratch(epoch=5)
    cos, sin = rope_tables(lw.dims.model, layer_id)
    y_exec = torch.empty_like(sc.x)
    ScheduleExecutor(plan, lw, cos, sin).run(scratch, exec_sc, y_exec)
    agree = region_agreement(plan, runner.scratch, scratch)
    for name in MAILBOXES + BIT_EXACT:
        assert agree[name] == 1.0, name
    for name, bound in QUANTIZED.items():
        assert 1 - agree[name] <= bound, f"{name}: {agree[name]:.6f} of the values agree"
    for name, bound in ACCUMULATED.items():
        got_r, want_r = plan.regions[name].view(runner.scratch), plan.regions[name].view(scratch)
        torch.testing.assert_close(got_r, want_r, rtol=0, atol=bound, msg=name)
    for name, bound in LONG_SUMS.items():
        got_r = plan.regions[name].view(runner.scratch).float()
        want_r = plan.regions[name].view(scratch).float()
        assert (got_r - want_r).norm() <= bound * want_r.norm(), name
    assert set(agree) == set(MAILBOXES + BIT_EXACT) | set(QUANTIZED | ACCUMULATED | LONG_SUMS)
    assert int(runner.views["ctl"][CTL_EPOCH]) == 6
    assert torch.equal(kernel_sc.window_cache.data, exec_sc.window_cache.data)
    if agree["x8b"] == 1.0:  # y sums over x8b: the same values give the same bits
        assert torch.equal(seams["y"], y_exec)
    else:  # x8b values on the other side of a tie (QUANTIZED) move y's sums
        y, want = seams["y"].float(), y_exec.float()
        assert (y - want).norm() <= Y_AFTER_FLIPS * want.norm(), "y"

    assert_near_reference(parity(lw.dims, seams, run_reference(lw, sc)))
    return runner


@pytest.mark.parametrize("tp, layer_id, tokens, gemv_block",
                         [(4, 1, 5, None), pytest.param(2, 2, 8, 32, marks=pytest.mark.slow)])
def test_dequantized_activations_change_no_bit(
    tp: int, layer_id: int, tokens: int, gemv_block: int | None, tiny_layer, run_mono
) -> None:
    """Tensor-core GEMV blocks reading the bf16 activations their producers dequantized
    (Tuning.a_dequantized) give y, every scratch region of the default and the window cache bit
    for bit: the bf16 of an MXFP8 value is exact, so the dot's operand is the one the default
    dequantizes. Each new region is torch's dequantization of the MXFP8 region it stands for.
    The default blocks give wo_a two K blocks a part (the rest one); GEMV blocks of 32 columns
    give every GEMV several."""
    lw = tiny_layer(tp, layer_id)
    sc = make_scenario(lw.dims, layer_id, tokens, seed=tokens)
    block = {} if gemv_block is None else {"gemv_block": gemv_block}
    runs = {}
    for deq in (False, True):
        runner = MonoRunner(lw, tokens, epoch=5,
                            tuning=resolve(lw.dims, tokens, a_dequantized=deq, **block))
        assert not runner.plan.tiling["GEMV_CORES"] and runner.plan.tiling["A_DEQ"] == deq
        kernel_sc = sc.clone_caches()
        runs[deq] = runner, run_mono(runner, kernel_sc), kernel_sc
    (off, seams_off, sc_off), (on, seams_on, sc_on) = runs[False], runs[True]
    assert list(on.plan.regions) == [*off.plan.regions, *DEQUANTIZED]
    for name, region in off.plan.regions.items():
        got, want = region.view(on.scratch, tokens), region.view(off.scratch, tokens)
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), name
    assert torch.equal(sc_on.window_cache.data, sc_off.window_cache.data)
    assert torch.equal(seams_on["y"], seams_off["y"])
    v = on.views
    for name, mx in zip(DEQUANTIZED, ("x8", "qx8", "xo", "x8b"), strict=True):
        assert torch.equal(v[name], mxfp8_dequantize(v[mx], v[mx + "s"]).bfloat16()), name


@pytest.mark.parametrize("tokens, cores, words", [(1, True, False), (1, True, True),
                                                 (5, False, False)])
def test_partial_last_k_block(tokens: int, cores: bool, words: bool, tiny_layer, run_mono,
                              run_reference) -> None:
    """q_rank 160: wq_b's K runs in one block of 256 whose last 96 columns are masked (at the
    flash geometry 1280 runs in 512, 512, 256), on CUDA cores (weights as values or as words)
    and on tensor cores."""
    lw = tiny_layer(4, 1, q_rank=160)
    sc = make_scenario(lw.dims, 1, tokens, seed=11)
    tuning = resolve(lw.dims, tokens, gemv_cores=cores, gemv_words=words)
    runner = MonoRunner(lw, tokens, tuning=tuning)
    assert runner.plan.tiling["BK_QR"] == 256 and runner.plan.tiling["GEMV_WORDS"] == words
    assert_near_reference(parity(lw.dims, run_mono(runner, sc.clone_caches()),
                                 run_reference(lw, sc)))  # fmt: skip


def test_task_trace_needs_a_gpu_and_its_shape(tiny_layer) -> None:
    """The task trace reads the NVIDIA global timer: refused in the interpreter, by name."""
    lw = tiny_layer(4, 2)
    sc = make_scenario(lw.dims, lw.layer_id, 1, seed=3)
    runner = MonoRunner(lw, 1)
    step = (sc, torch.empty_like(sc.x))
    trace = torch.zeros(runner.plan.total_tasks, 3, dtype=torch.int64)
    with pytest.raises(ValueError, match="PTX global timer.*inline PTX off"):
        runner.launch(*step, trace=trace)
