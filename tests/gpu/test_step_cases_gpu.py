"""Each kernel backend's step against the reference at the real geometry (dsv41-flash) on the
GPU, seam by seam, held to about 3x the worst error ``benchmarks/seam_errors.py`` measures
there; hand-written key tables; tp 8 end to end; a mono layer's prefill step.

The bounds are the tables below; to re-derive them on the H200:
``PYTHONPATH=$PWD python3 benchmarks/seam_errors.py --tp 4 2 --tokens 1 2 4 16 33 48 --seeds 1``
(its "3x bounds": all tokens, and all but the farthest one).
"""

from __future__ import annotations

import pytest
import torch
from step_helpers import (
    EXACT,
    StepRun,
    drop_token,
    farthest_token,
    hand_written_step,
    misses,
    run_step,
    step_errors,
)

from dsv41 import backends
from dsv41.common.geometry import Dims
from dsv41.common.reference import reference_step, sum_rank_partials
from dsv41.common.scenario import make_scenario
from dsv41.common.weights import LayerWeights
from dsv41.layer import CacheMetadata, DSV41Attention

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

MODEL = "dsv41-flash"
DEVICE = "cuda"
# Per seam: rel L2 at most, E8M0 codes at least: 3x the worst measured on the H200, rounded up
# to 2 significant digits. Measured 2026-12-04, tree 1c3678c, dsv41-flash, both layer kinds:
# ``benchmarks/seam_errors.py --tp 4 2 --tokens 1 2 4 16 48 --seeds 1``; worst rel L2:
#   mono:   qkv 6.42e-5, q 5.74e-5, xo 5.33e-4, z 7.94e-4, y 3.39e-3 (window layer, tp 2, M 2),
#           window cache 6.05e-4, x8 0
#   nvidia: qkv 2.67e-5, kv 9.57e-5, q 5.70e-5, xo 5.82e-4, z 8.54e-4, y 4.55e-3 (compressed
#           layer, tp 4, M 1), lse 1.96e-6, window cache 6.05e-4
# xo's codes (and mono's x8's) all equal the reference's. A code moves only when a 32-value
# group's amax sits on a power-of-two edge and an ulp carries it across, which other data can
# hit, so xo allows 1 code in 10^4; a wrong rounding or scale moves far more than that. x8 is x
# quantized with no arithmetic before it: exact.
CODES = 0.9999
GPU_BOUNDS = {
    "mono": {
        "x8": EXACT,
        "qkv": {"rel_l2": 2.0e-4},
        "q": {"rel_l2": 1.8e-4},
        "xo": {"rel_l2": 1.6e-3, "codes": CODES},
        "z": {"rel_l2": 2.4e-3},
        "y": {"rel_l2": 1.1e-2},
        "window": {"rel_l2": 1.9e-3},
    },
    "nvidia": {
        "qkv": {"rel_l2": 8.1e-5},
        "kv": {"rel_l2": 2.9e-4},
        "q": {"rel_l2": 1.8e-4},
        "xo": {"rel_l2": 1.8e-3, "codes": CODES},
        "z": {"rel_l2": 2.6e-3},
        "y": {"rel_l2": 1.4e-2},
        "lse": {"rel_l2": 5.9e-6},
        "window": {"rel_l2": 1.9e-3},
    },
}
# One token of a step may flip a quantization against the reference: at tp 4, compressed layer,
# M = 33 (seed 33), token 29's qkv rounds one bf16 ulp apart from the reference's in both
# kernels (qkv rel 1.8e-4 on that row), qr's MXFP8 cast then lands on another e4m3 value, and
# that token's q is 7.4e-3 off (xo 2.1e-2, y 3.4e-2) while the two kernels agree to 4e-5 and every
# other token is as close as at other M. So every token but the farthest (by q) is held to
# GPU_BOUNDS, and the whole step to FLIP_BOUNDS: 3x that step's errors, measured 2026-12-04 on
# tree f6a2ec2 with the command in the docstring: nvidia q 1.28e-3, xo 2.80e-3, z 2.89e-3,
# y 6.28e-3, lse 2.56e-5; mono q 1.28e-3, xo 2.86e-3, z 2.95e-3, y 6.60e-3. A wrong rounding,
# scale or index moves every token, far past both.
_FLIPPED = {
    "mono": {"q": 3.9e-3, "xo": 8.6e-3, "z": 8.9e-3, "y": 2.0e-2},
    "nvidia": {"q": 3.9e-3, "xo": 8.5e-3, "z": 8.7e-3, "y": 1.9e-2, "lse": 7.7e-5},
}
FLIP_BOUNDS = {
    name: {**GPU_BOUNDS[name], **{s: {**GPU_BOUNDS[name][s], "rel_l2": r} for s, r in flip.items()}}
    for name, flip in _FLIPPED.items()
}


def assert_within_but_one(got: StepRun, want: StepRun, backend: str) -> None:
    """The step within GPU_BOUNDS, or else every token but the farthest within GPU_BOUNDS and the
    whole step within FLIP_BOUNDS (one quantization flip, above)."""
    errors = step_errors(got, want)
    if not misses(errors, GPU_BOUNDS[backend]):
        return
    token = farthest_token(got, want)
    rest = step_errors(drop_token(got, token), drop_token(want, token))
    bad = misses(errors, FLIP_BOUNDS[backend]) + [
        f"all tokens but {token}: {m}" for m in misses(rest, GPU_BOUNDS[backend])
    ]
    assert not bad, "; ".join(bad) + f"\nall errors: {errors}"


# Not measured by seam_errors.py (tp 2 and 4, M <= 48 only), so kept at the suite's earlier
# 1e-2: the tp 8 sum rests on each rank's y (nvidia's worst 4.55e-3 above) plus the 8 bf16
# partials' own rounding (2.6e-3 against the tp 1 y on CPU, tests/test_step_cases.py); the
# prefill bound on nvidia's y at M 49..200 (its worst 4.55e-3 at M <= 48).
TP8_SUM_REL = 1e-2
PREFILL_Y_REL = 1e-2


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
    assert_within_but_one(run_step(backend, lw, sc), run_step("reference", lw, sc), backend)


@pytest.mark.parametrize("backend", backends.KERNEL_BACKENDS)
@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("compressed", [False, True], ids=["window", "compressed"])
def test_hand_written_key_table_and_slots_gpu(backend, tp, compressed):
    lw = _layer(tp, compressed)
    inputs = hand_written_step(lw, seed=tp, device=DEVICE)
    assert_within_but_one(run_step(backend, lw, inputs), run_step("reference", lw, inputs), backend)


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
        assert_within_but_one(got, run_step("reference", lw, sc), "nvidia")
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
    assert rel <= PREFILL_Y_REL, rel
