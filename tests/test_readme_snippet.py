"""The README's "In a server" code block runs as written (issue 37, 8): executed on the CPU at
the tiny geometry over a synthesized checkpoint directory, with the step's inputs a server
would have; its y equals the ranks' reference steps, loaded and summed independently."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from dsv41.common.checkpoint import load_layer, synth_checkpoint
from dsv41.common.geometry import Dims
from dsv41.common.kv_cache import PagedKVCache, build_key_table, window_slots
from dsv41.common.reference import reference_step
from dsv41.common.step_inputs import StepInputs
from dsv41.common.weights import LayerWeights

README = Path(__file__).resolve().parents[1] / "README.md"
LAYER, TOKENS, TP = 2, 3, 4


def server_block() -> str:
    """The python code block of the README's "## In a server" section."""
    text = README.read_text()
    section = text[text.index("## In a server"):]
    section = section[: section.index("\n## ", 1)]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1, f"expected one python block in 'In a server', got {len(blocks)}"
    return blocks[0]


def test_the_server_snippet_runs_and_gives_the_layer_output(tmp_path, monkeypatch):
    monkeypatch.delenv("DSV41_BACKEND", raising=False)
    synth_checkpoint("tiny", 3, tmp_path / "ckpt", shards=2, seed=8, like="dsv41-flash")
    m = Dims.of("tiny", TP).model
    gen = torch.Generator().manual_seed(38)
    positions = torch.tensor([5, 40, 77])
    pages = -(-int(positions.max() + 1) // m.window_block)
    block_tables = torch.randperm(TOKENS * pages, generator=gen).view(TOKENS, pages).int()
    topk = torch.randint(0, 1024, (TOKENS, m.topk), generator=gen).int()
    topk[0, 5:] = -1
    x = torch.randn(TOKENS, m.hidden, generator=gen).bfloat16()
    scope = {"ckpt_dir": str(tmp_path / "ckpt"), "layer_id": LAYER, "x": x,
             "positions": positions, "block_tables": block_tables, "topk": topk}  # fmt: skip
    exec(compile(server_block(), str(README), "exec"), scope)
    y = scope["y"]

    # Independently: each rank's weights loaded straight from the files, caches built by hand.
    total = torch.zeros(TOKENS, m.hidden)
    for rank in range(TP):
        lw = LayerWeights(Dims.of(scope["attn"].dims.model, TP), rank, LAYER)
        load_layer(tmp_path / "ckpt", lw)
        window = PagedKVCache(64, m.window_block, "fp8_ds_mla")
        comp = PagedKVCache(1024 // 64, 64, "fp8_ds_mla")
        slots = window_slots(positions[:, None], block_tables, m.window_block)[:, 0]
        table = build_key_table(positions, block_tables, window=m.window, block=m.window_block,
                                topk=topk, keys=m.keys)  # fmt: skip
        total += reference_step(lw, StepInputs(x, positions, slots, table, window, comp)).y.float()
    assert y.dtype == torch.bfloat16 and torch.isfinite(y.float()).all()
    assert torch.equal(y, total.bfloat16())
    assert y.float().norm() > 0
