"""TP 2 on two GPUs at the real geometry (dsv41-flash), NCCL, both kernel backends.

Two processes (one a GPU) run a compressed layer's step with the deterministic reduce at
M = 1, 16 and 48, eagerly twice and once as a CUDA graph holding the step and the reduce.
The parent then sums the same backend's rank partials in one process on one GPU: every rank's
output equals that sum bit for bit (each run, each rank, the graph too), and the reference's
sum of partials within parity's tolerance.
"""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

if torch.cuda.device_count() < 2:
    pytest.skip("needs two GPUs", allow_module_level=True)

from dsv41 import backends, distributed
from dsv41.bench import capture_graph
from dsv41.common.geometry import Dims
from dsv41.common.reference import sum_rank_partials
from dsv41.common.scenario import make_scenario
from dsv41.common.weights import LayerWeights
from dsv41.parity import DEFAULT_REL_TOL

MODEL, TP, SEED = "dsv41-flash", 2, 11
TOKENS = (1, 16, 48)
BACKENDS = ("nvidia", "mono")


def _layer_id() -> int:
    """The first compressed layer: it reads the window and the compressed cache."""
    return next(i for i, r in enumerate(Dims.of(MODEL, TP).model.compress_ratios) if r)


def _scenario(m: int, device):
    return make_scenario(Dims.of(MODEL, TP), _layer_id(), m, seed=SEED + m, device=device)


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    device = distributed.init(init_method=f"file://{init_file}", rank=rank, world_size=TP)
    outs = {}
    for name in BACKENDS:
        tpl = distributed.TensorParallelAttention(MODEL, _layer_id(), name, max_tokens=max(TOKENS))
        tpl.weights.dummy_load(SEED)
        for m in TOKENS:
            sc = _scenario(m, device)
            eager = [tpl(sc.x, sc.positions, distributed.cache_metadata(sc.clone_caches()))
                     for _ in range(2)]  # fmt: skip
            g_sc, graphed = sc.clone_caches(), {}
            meta = distributed.cache_metadata(g_sc)

            def step():
                graphed["y"] = tpl(g_sc.x, g_sc.positions, meta)

            capture_graph(step)  # captures the step and the reduce, replays once
            torch.cuda.synchronize()
            outs[name, m] = [t.cpu() for t in (*eager, graphed["y"])]
    torch.save(outs, f"{out_dir}/rank{rank}.pt")
    torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[dict]:
    d = tmp_path_factory.mktemp("tp2_gpu")
    mp.spawn(_worker, args=(str(d / "rendezvous"), str(d)), nprocs=TP)
    return [torch.load(d / f"rank{r}.pt") for r in range(TP)]


@pytest.fixture(scope="module")
def rank_layers() -> list[LayerWeights]:
    dims, device = Dims.of(MODEL, TP), torch.device("cuda", 0)
    layers = [LayerWeights(dims, r, _layer_id(), device=device) for r in range(TP)]
    for lw in layers:
        lw.dummy_load(SEED)
    return layers


def single_process_sum(layers, backend: str, m: int) -> torch.Tensor:
    """The backend's rank partials computed in this process on GPU 0, summed (fp32, rank order)."""
    sc = _scenario(m, layers[0].wqkv.device)
    forward = backends.get(backend).forward
    return sum_rank_partials([forward(lw, sc.clone_caches()) for lw in layers]).cpu()


@pytest.mark.parametrize("m", TOKENS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_tp2_equals_single_process_sum_and_reference(runs, rank_layers, backend, m):
    want = single_process_sum(rank_layers, backend, m)
    reference = single_process_sum(rank_layers, "reference", m)
    for rank, outs in enumerate(runs):
        first, second, graphed = outs[backend, m]
        assert torch.equal(first, want), f"rank {rank}: eager differs from the single-process sum"
        assert torch.equal(second, first), f"rank {rank}: a second run differs"
        assert torch.equal(graphed, first), f"rank {rank}: the CUDA graph's output differs"
    rel = float((want.float() - reference.float()).norm() / reference.float().norm())
    assert rel <= DEFAULT_REL_TOL, f"rel L2 {rel:.3e} vs the reference's sum"
