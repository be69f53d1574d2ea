"""Random decode-step inputs with real structure: sequences, paged caches, top-k, key tables.

Tests, the CLI and benchmarks all build their inputs here, so every backend is
fed the same kind of step: each token is the newest of its own sequence, its
earlier window positions already hold records (in pages shuffled across the
cache), and compressed layers pick top-k rows of a filled compressed cache with
some -1 padding.
"""

from __future__ import annotations

import dataclasses

import torch

from dsv41.common.geometry import Dims
from dsv41.common.kv_cache import COMPRESSED_BLOCK, PagedKVCache, build_key_table, window_slots
from dsv41.common.step_inputs import StepInputs


@dataclasses.dataclass(frozen=True)
class Scenario(StepInputs):
    """A step's inputs (what every step function takes) plus how its key table was built."""

    block_tables: torch.Tensor | None = None  # int32 [M, max_pages]
    topk: torch.Tensor | None = None  # int32 [M, TOPK] or None (window-only layer)


def make_scenario(
    dims: Dims,
    layer_id: int,
    tokens: int,
    *,
    fmt: str = "fp8_ds_mla",
    seed: int = 0,
    device="cpu",
    max_context: int | None = None,
    compressed_rows: int | None = None,
) -> Scenario:
    """A step of ``tokens`` tokens, each the newest of its own sequence (positions 0 .. max_context - 1)."""
    m = dims.model
    gen = torch.Generator().manual_seed(seed)
    block = m.window_block
    max_context = max_context or 4 * m.window
    positions = torch.randint(0, max_context, (tokens,), generator=gen)
    positions[0] = min(3, max_context - 1)  # always one sequence shorter than the window
    pages_per_seq = (max_context + block - 1) // block
    num_pages = tokens * pages_per_seq + 1
    block_tables = torch.randperm(num_pages, generator=gen)[: tokens * pages_per_seq]
    block_tables = block_tables.view(tokens, pages_per_seq).to(torch.int32)
    window_cache = PagedKVCache(num_pages, block, fmt)
    hist = positions[:, None] - torch.arange(1, m.window)  # earlier positions in the window
    live = hist >= 0
    hist_slots = window_slots(hist.clamp(min=0), block_tables, block)[live]
    window_cache.insert(hist_slots, torch.randn(hist_slots.numel(), m.kv_dim, generator=gen).bfloat16())
    slot_mapping = window_slots(positions[:, None], block_tables, block)[:, 0]

    topk = compressed_cache = None
    if m.compress_ratios[layer_id]:
        rows = compressed_rows or max(2 * m.topk, COMPRESSED_BLOCK)
        rows = -(-rows // COMPRESSED_BLOCK) * COMPRESSED_BLOCK
        compressed_cache = PagedKVCache(rows // COMPRESSED_BLOCK, COMPRESSED_BLOCK, fmt)
        compressed_cache.insert(torch.arange(rows), torch.randn(rows, m.kv_dim, generator=gen).bfloat16())
        topk = torch.stack([torch.randperm(rows, generator=gen)[: m.topk] for _ in range(tokens)]).int()
        n_valid = torch.randint(0, m.topk + 1, (tokens,), generator=gen)
        n_valid[-1] = m.topk  # one token with a full top-k
        if tokens > 1:
            n_valid[0] = 0  # and one with none
        topk[torch.arange(m.topk)[None, :] >= n_valid[:, None]] = -1
    key_table = build_key_table(
        positions, block_tables, window=m.window, block=block, topk=topk, keys=m.keys
    )
    x = torch.randn(tokens, m.hidden, generator=gen).bfloat16()
    to = lambda t: None if t is None else t.to(device)
    for cache in (window_cache, compressed_cache):
        if cache is not None:
            cache.data = cache.data.to(device)
    return Scenario(
        x=to(x), positions=to(positions), block_tables=to(block_tables), slot_mapping=to(slot_mapping),
        topk=to(topk), key_table=to(key_table), window_cache=window_cache, compressed_cache=compressed_cache,
    )
