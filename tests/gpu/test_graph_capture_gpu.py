"""``DSV41Attention.forward`` captured in the caller's CUDA graph (as a server captures its decode
step) and replayed, for both kernel backends at dsv41-flash, tp 4, M = 1 and 48: every replay
bit-identical to the eager forward on the same inputs (issue 37, 9)."""

from __future__ import annotations

import pytest
import torch

from dsv41.common.geometry import Dims
from dsv41.common.scenario import make_scenario
from dsv41.layer import CacheMetadata, DSV41Attention

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

MODEL, TP, RANK = "dsv41-flash", 4, 3
REPLAYS = 20


def _compressed_layer() -> int:
    return next(i for i, r in enumerate(Dims.of(MODEL, TP).model.compress_ratios) if r)


@pytest.mark.parametrize("tokens", [1, 48])
@pytest.mark.parametrize("backend", ["nvidia", "mono"])
def test_forward_captures_and_replays_bit_identical(backend, tokens, monkeypatch):
    monkeypatch.delenv("DSV41_BACKEND", raising=False)
    layer_id = _compressed_layer()
    layer = DSV41Attention(MODEL, TP, RANK, layer_id, backend=backend, max_tokens=48)
    layer.weights.dummy_load(seed=7)
    sc = make_scenario(layer.dims, layer_id, tokens, seed=tokens, device="cuda")
    meta = CacheMetadata(sc.slot_mapping, sc.key_table, sc.window_cache, sc.compressed_cache)
    x, positions = sc.x.clone(), sc.positions.clone()

    side = torch.cuda.Stream()  # warm-up off the default stream, as torch.cuda.graph asks
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # compiles, sizes scratch, creates the runner
            eager = layer(x, positions, meta).clone()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert torch.isfinite(eager.float()).all()

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = layer(x, positions, meta)
    for i in range(REPLAYS):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, eager), f"replay {i}: differs from eager"

    x.copy_(torch.randn_like(x.float()).bfloat16())  # new inputs at the captured addresses
    graph.replay()
    fresh = layer(x, positions, meta)  # eager, outside the capture
    torch.cuda.synchronize()
    assert torch.equal(y, fresh)
    assert not torch.equal(y, eager)
