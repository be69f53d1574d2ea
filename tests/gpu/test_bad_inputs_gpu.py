"""The bad-value contract (docs/bad_inputs.md) on the GPU, where a float max may drop a NaN:
dsv41-flash, tp 4, both kernel backends; a step with a NaN in one token's x, a -1 slot with a
position past max_position, a slot past the cache with a negative position, and key-table
entries outside their caches. The NaN token's y row is NaN, the others match the reference
(y within 1e-2), and no page but the stored tokens' changes."""

from __future__ import annotations

import pytest
import torch

from dsv41 import backends
from dsv41.common.geometry import Dims
from dsv41.common.kv_cache import COMPRESSED_FLAG
from dsv41.common.reference import reference_step
from dsv41.common.scenario import make_scenario
from dsv41.common.step_inputs import StepInputs
from dsv41.common.weights import LayerWeights

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

MODEL, TP = "dsv41-flash", 4


def _int32(entry: int) -> int:
    return entry - (1 << 32) if entry >= 1 << 31 else entry


@pytest.mark.parametrize("backend", ["nvidia", "mono"])
def test_kernels_answer_bad_values_as_the_reference_on_the_gpu(backend):
    dims = Dims.of(MODEL, TP)
    layer_id = next(i for i, r in enumerate(dims.model.compress_ratios) if r)
    lw = LayerWeights(dims, TP - 1, layer_id, device="cuda")
    lw.dummy_load(seed=37)
    sc = make_scenario(dims, layer_id, 4, seed=41, device="cuda")
    x, positions, slots, table = (sc.x.clone(), sc.positions.clone(), sc.slot_mapping.clone(),
                                  sc.key_table.clone())  # fmt: skip
    x[1, 7] = float("nan")
    positions[2], positions[3] = dims.model.max_position + 5, -3
    slots[2], slots[3] = -1, sc.window_cache.num_slots + 2
    table[0, -1] = sc.window_cache.num_slots + 9
    table[3, -1] = _int32((sc.compressed_cache.num_slots + 4) | COMPRESSED_FLAG)
    bad = StepInputs(x, positions, slots, table, sc.window_cache, sc.compressed_cache)
    ref = reference_step(lw, bad.clone_caches()).y
    run = bad.clone_caches()
    y = backends.get(backend).step(lw, run)["y"]
    torch.cuda.synchronize()
    other = [0, 2, 3]
    assert y[1].isnan().all() and not y[other].isnan().any()
    assert ref[1].isnan().all()
    rel = (y[other].float() - ref[other].float()).norm() / ref[other].float().norm()
    assert rel <= 1e-2, rel
    touched = {int(s) // run.window_cache.block for s in slots[:2]}
    for page in range(run.window_cache.data.shape[0]):
        if page not in touched:
            assert torch.equal(run.window_cache.data[page], bad.window_cache.data[page]), page
    assert torch.equal(run.compressed_cache.data, bad.compressed_cache.data)
