"""Each kernel backend's step against the reference at the real geometry (dsv41-flash) on the
GPU, seam by seam, held to about 3x the worst error ``benchmarks/seam_errors.py`` measures
there; hand-written key tables; tp 8 end to end; a mono layer's prefill step.

The bounds are the table below; to re-derive them on the H200:
``PYTHONPATH=$PWD python benchmarks/seam_errors.py --json seam_errors.json`` (its "3x bounds").
"""

from __future__ import annotations

import pytest
import torch
from step_helpers import assert_within, hand_written_step, run_step, step_errors

from dsv41 import backends
from dsv41.common.geometry import Dims
from dsv41.common.reference import reference_step, sum_rank_partials
from dsv41.common.scenario import make_scenario
from dsv41.common.weights import LayerWeights
from dsv41.layer import CacheMetadata, DSV41Attention

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

MODEL = "dsv41-flash"
DEVICE = "cuda"
# Per seam: rel L2 at most, E8M0 codes at least. Provisional (the suite's earlier GPU bounds:
# y 1e-2, codes 0.999) until seam_errors.py's H200 figures replace them with 3x the worst.
GPU_BOUNDS = {
    name: {
        "qkv": {"rel_l2": 1e-2},
        "q": {"rel_l2": 1e-2},
        "xo": {"rel_l2": 1e-2, "codes": 0.999},
        "z": {"rel_l2": 1e-2},
        "y": {"rel_l2": 1e-2},
    }
    for name in backends.KERNEL_BACKENDS
}
TP8_SUM_REL = 1e-2  # 8 bf16 partials summed against the tp 1 reference's bf16 y


def _layer_id(compressed: bool) -> int:
    ratios = Dims.of(MODEL, 1).model.compress_ratios
    return next(i for i, r in enumerate(ratios) if bool(r) == compressed)


_LAYERS: dict = {}


def _layer(tp: int, compressed: bool, rank: int | None = None) -> LayerWeights:
    key = (tp, compressed, rank)
    if key not in _LAYERS:
        layer_id = _layer_id(compressed)
        lw = LayerWeights(Dims.of(MODEL, tp), tp - 1 if rank is None else rank, layer_id,
                          device=DEVICE)  # fmt: skip
        lw.dummy_load(seed=100 + tp + layer_id)
        _LAYERS[key] = lw
    return _LAYERS[key]


@pytest.mark.parametrize("backend", backends.KERNEL_BACKENDS)
@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("compressed", [False, True], ids=["window", "compressed"])
@pytest.mark.parametrize("tokens", [1, 2, 5, 16, 33, 48])
def test_step_within_measured_bounds_gpu(backend, tp, compressed, tokens):
    lw = _layer(tp, compressed)
    sc = make_scenario(lw.dims, lw.layer_id, tokens, seed=tokens, device=DEVICE)
    errors = step_errors(run_step(backend, lw, sc), run_step("reference", lw, sc))
    assert_within(errors, GPU_BOUNDS[backend])


@pytest.mark.parametrize("backend", backends.KERNEL_BACKENDS)
@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("compressed", [False, True], ids=["window", "compressed"])
def test_hand_written_key_table_and_slots_gpu(backend, tp, compressed):
    lw = _layer(tp, compressed)
    inputs = hand_written_step(lw, seed=tp, device=DEVICE)
    errors = step_errors(run_step(backend, lw, inputs), run_step("reference", lw, inputs))
    assert_within(errors, GPU_BOUNDS[backend])


@pytest.mark.parametrize("compressed", [False, True], ids=["window", "compressed"])
def test_tp8_ranks_sum_to_the_whole_layer_gpu(compressed):
    """nvidia at tp 8 (one wo_a group a rank): each rank within its bounds, the 8 partials
    summed against the tp 1 reference."""
    layer_id = _layer_id(compressed)
    sc = make_scenario(Dims.of(MODEL, 1), layer_id, 4, seed=3, device=DEVICE)
    whole = LayerWeights(Dims.of(MODEL, 1), 0, layer_id, device=DEVICE)
    whole.dummy_load(seed=8)
    want = reference_step(whole, sc.clone_caches()).y.float()
    partials = []
    for rank in range(8):
        lw = LayerWeights(Dims.of(MODEL, 8), rank, layer_id, device=DEVICE)
        lw.dummy_load(seed=8)
        got = run_step("nvidia", lw, sc)
        assert_within(step_errors(got, run_step("reference", lw, sc)), GPU_BOUNDS["nvidia"])
        partials.append(got.seams["y"].bfloat16())
    y = sum_rank_partials(partials).float()
    assert float((y - want).norm() / want.norm()) <= TP8_SUM_REL


@pytest.mark.parametrize("tokens", [49, 64, 200])
def test_mono_layer_prefill_step_gpu(tokens):
    """A mono layer given more than 48 tokens runs nvidia's kernels (mono's forward refuses)."""
    layer = DSV41Attention(MODEL, 4, 3, _layer_id(True), backend="mono")
    layer.weights.dummy_load(4)

    def refuse(*args):
        raise AssertionError("mono's forward called with more than 48 tokens")

    layer._forward = refuse
    sc = make_scenario(layer.dims, layer.weights.layer_id, tokens, seed=tokens, device=DEVICE)
    want = reference_step(layer.weights, sc.clone_caches()).y.float()
    y = layer(sc.x, sc.positions,
              CacheMetadata(sc.slot_mapping, sc.key_table, sc.window_cache, sc.compressed_cache))
    rel = float((y.float() - want).norm() / want.norm())
    assert rel <= GPU_BOUNDS["nvidia"]["y"]["rel_l2"], rel
