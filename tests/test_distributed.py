"""dsv41.distributed on CPU: two gloo processes at the tiny geometry, tp 2.

Each process runs the layer's steps with the deterministic reduce; the parent sums the ranks'
reference partials in one process, written out here as the contract says (fp32, rank order,
bf16), and the distributed output must equal it bit for bit on every rank, twice.
``dsv41 parity --distributed`` runs in the same processes (torchrun's launch, with a file
rendezvous). The reduce's order and precision are checked at tp 4 with a stand-in all-gather.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.multiprocessing as mp

from dsv41 import distributed
from dsv41.common.geometry import Dims
from dsv41.common.reference import reference_step
from dsv41.common.scenario import make_scenario
from dsv41.common.weights import LayerWeights

MODEL, TP, LAYER, SEED = "tiny", 2, 1, 7  # layer 1 reads the window and the compressed cache
TOKENS = (3, 1)  # the larger step first: the smaller one reuses the front of the gather buffer
MAX_TOKENS = 4


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    from dsv41 import cli

    distributed.init(init_method=f"file://{init_file}", rank=rank, world_size=TP)
    tpl = distributed.TensorParallelAttention(MODEL, LAYER, "reference", max_tokens=MAX_TOKENS)
    tpl.weights.dummy_load(SEED)
    outs = {}
    for m in TOKENS:
        sc = make_scenario(Dims.of(MODEL, TP), LAYER, m, seed=SEED + m)
        outs[m] = [tpl(sc.x, sc.positions, distributed.cache_metadata(sc.clone_caches()))
                   for _ in range(2)]  # fmt: skip
    torch.save(outs, f"{out_dir}/rank{rank}.pt")
    rc = cli.main(["parity", "--distributed", "--tp", str(TP), "--tokens", "2", "--backends",
                   "reference", "--json", f"{out_dir}/parity.json"])  # fmt: skip
    bad_tp = cli.main(["parity", "--distributed", "--tp", "4", "--backends", "reference"])
    torch.save((rc, bad_tp), f"{out_dir}/rc{rank}.pt")
    torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Both ranks' outputs (each step twice) and the CLI's exit codes and JSON."""
    d = tmp_path_factory.mktemp("tp2")
    mp.spawn(_worker, args=(str(d / "rendezvous"), str(d)), nprocs=TP)
    outs = [torch.load(d / f"rank{r}.pt") for r in range(TP)]
    rcs = [torch.load(d / f"rc{r}.pt") for r in range(TP)]
    return outs, rcs, json.loads((d / "parity.json").read_text())


def single_process_sum(m: int) -> torch.Tensor:
    dims = Dims.of(MODEL, TP)
    sc = make_scenario(dims, LAYER, m, seed=SEED + m)
    total = torch.zeros(m, dims.model.hidden)
    for rank in range(TP):
        lw = LayerWeights(dims, rank, LAYER)
        lw.dummy_load(SEED)
        total += reference_step(lw, sc.clone_caches()).y.float()
    return total.bfloat16()


@pytest.mark.slow  # two processes spawned: ~25 s on a 2-core CPU
def test_distributed_output_is_the_single_process_sum_bit_for_bit(run):
    outs, _, _ = run
    for m in TOKENS:
        want = single_process_sum(m)
        assert want.float().abs().mean() > 0.01  # random data, not zeros
        for rank in range(TP):
            got = outs[rank][m][0]
            assert got.dtype == torch.bfloat16 and got.shape == want.shape
            assert torch.equal(got, want), f"rank {rank}, M {m}"


@pytest.mark.slow  # two processes spawned: ~25 s on a 2-core CPU
def test_two_runs_give_identical_bits(run):
    outs, _, _ = run
    for m in TOKENS:
        for rank in range(TP):
            assert torch.equal(outs[rank][m][0], outs[rank][m][1]), f"rank {rank}, M {m}"


@pytest.mark.slow  # two processes spawned: ~25 s on a 2-core CPU
def test_parity_distributed_cli_is_green(run):
    _, rcs, report = run
    assert rcs == [(0, 2)] * TP  # --tp 4 under 2 processes: refused (exit 2), nothing run
    (row,) = report["distributed"]
    assert row["backend"] == "reference" and row["tp"] == TP and row["tokens"] == 2
    assert row["equals_single_process"] and row["repeat_identical"] and row["ranks_agree"]


def test_reduce_sums_in_fp32_in_rank_order(monkeypatch):
    """tp 4, a stand-in all-gather: random rows and a row whose sum depends on the order
    (2^24 + 1 + 1 - 2^24 is 0 in rank order, 2 in reverse, 1 pairwise)."""
    tp, m, hidden = 4, 3, 64
    gen = torch.Generator().manual_seed(0)
    partials = torch.randn(tp, m, hidden, generator=gen).bfloat16()
    partials[:, 1, 0] = torch.tensor([2.0**24, 1.0, 1.0, -(2.0**24)]).bfloat16()

    def gather(out, partial, group=None):
        assert torch.equal(partial, partials[2])  # this process is rank 2
        out.copy_(partials.reshape(tp * m, hidden))

    monkeypatch.setattr(distributed, "_all_gather", gather)
    reduce = distributed.RankReduce(tp, 8, hidden, "cpu")
    got = reduce(partials[2])
    want = torch.zeros(m, hidden)
    for r in range(tp):
        want += partials[r].float()
    assert torch.equal(got, want.bfloat16())
    assert got[1, 0].item() == 0.0


def test_reduce_refuses_a_bad_partial():
    reduce = distributed.RankReduce(2, 4, 64, "cpu")
    for bad in (torch.zeros(5, 64).bfloat16(), torch.zeros(2, 64), torch.zeros(2, 32).bfloat16()):
        with pytest.raises(ValueError, match=r"partial: expected bfloat16 \[M <= 4, 64\]"):
            reduce(bad)


def test_layer_needs_a_process_group():
    assert not torch.distributed.is_initialized()
    with pytest.raises(RuntimeError, match=r"expected an initialised process group"):
        distributed.TensorParallelAttention(MODEL, LAYER, "reference")
