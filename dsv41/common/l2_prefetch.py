"""L2 prefetch of the weights a step will read later, so HBM streams across short launches.

A decode step at small M is a chain of short dependent stages, each reading one
weight matrix. Measured on the H200, a single launch reading ~10 MB never
reaches copy bandwidth (its loads ramp up and drain), so the step moves its
~40 MB at a fraction of what HBM gives. A prefetch plan fixes the overlap: an
early launch also asks the L2 for the weights of the stages after it
(``cp.async.bulk.prefetch.L2``, SM90+: fire and forget, no registers, no
wait), within an L2 budget, and those stages then read L2 instead of HBM.

The plan is a table of ``(address, bytes)`` chunks of the weight tensors,
built once per layer (the addresses are fixed, so a CUDA graph replays it),
and per site the rows ``[first, first + count)`` that site's launch requests.
It is a hint only: the numbers are the same with it off. Opt-in
(``DSV41_L2_PREFETCH=1``; never under the interpreter or before SM90).
"""

from __future__ import annotations

import dataclasses
import os
import weakref

import torch
import triton
import triton.language as tl

PREFETCH_CHUNK = 32 * 1024  # bytes one bulk prefetch asks for (16-B aligned, a multiple of 16)
BULK_ALIGN = 16  # cp.async.bulk wants 16-byte aligned addresses and sizes
L2_BUDGET_FRACTION = 0.6  # of the L2 that prefetched, not yet read weights may take
LANES_PER_WARP = 32
WEIGHT_SITES = ("wqkv", "wq_b", "wo_a", "wo_b")  # a layer's weight matrices in step order


def prefetch_enabled(device: torch.device) -> bool:
    """Bulk L2 prefetch applies: switched on, a CUDA device of SM90+, not the interpreter."""
    return (
        device.type == "cuda"
        and os.environ.get("TRITON_INTERPRET") != "1"
        and os.environ.get("DSV41_L2_PREFETCH", "0") == "1"
        and torch.cuda.get_device_capability(device)[0] >= 9
    )


def l2_budget(device: torch.device) -> int:
    """Bytes of weights that may sit prefetched in L2 at once (``DSV41_L2_PREFETCH_MB`` overrides)."""
    if "DSV41_L2_PREFETCH_MB" in os.environ:
        return int(float(os.environ["DSV41_L2_PREFETCH_MB"]) * 2**20)
    return int(L2_BUDGET_FRACTION * torch.cuda.get_device_properties(device).L2_cache_size)


def plan_sites(site_bytes: list[tuple[str, int]], budget: int) -> dict[str, list[str]]:
    """Which later sites each site's launch prefetches, in step order, under ``budget`` bytes.

    Greedy: at site i the sites after it that an earlier launch already asked
    for are resident; it adds the next sites in order while resident + their
    bytes stay within the budget (a site is prefetched whole or not at all).
    """
    names = [name for name, _ in site_bytes]
    size = dict(site_bytes)
    asked: set[str] = set()
    plan: dict[str, list[str]] = {}
    for i, name in enumerate(names):
        later = names[i + 1 :]
        resident = sum(size[s] for s in later if s in asked)
        plan[name] = []
        for s in later:
            if s in asked:
                continue
            if resident + size[s] > budget:
                break
            plan[name].append(s)
            asked.add(s)
            resident += size[s]
    return plan


def chunks(t: torch.Tensor, chunk: int = PREFETCH_CHUNK) -> list[tuple[int, int]]:
    """``(address, bytes)`` pieces of ``t``'s bytes, each <= ``chunk``; a tail under 16 B is left out.

    Never past the tensor: a hint must not touch memory the layer does not own.
    """
    if t.data_ptr() % BULK_ALIGN or not t.is_contiguous():
        raise ValueError(
            f"prefetch tensor: expected a contiguous tensor at a 16-B aligned address, "
            f"got address {t.data_ptr():#x}, strides {t.stride()}"
        )
    nbytes = t.numel() * t.element_size() // BULK_ALIGN * BULK_ALIGN
    return [(t.data_ptr() + a, min(chunk, nbytes - a)) for a in range(0, nbytes, chunk)]


@dataclasses.dataclass(frozen=True)
class PrefetchPlan:
    """The chunk table on the device and, per site, the rows its launch prefetches."""

    table: torch.Tensor  # int64 [rows, 2]: address, bytes
    rows: dict[str, tuple[int, int]]  # site -> (first, count); count 0: nothing

    def args(self, site: str) -> tuple[torch.Tensor, int, int]:
        """``(table, first, count)`` for a launch at ``site``."""
        first, count = self.rows.get(site, (0, 0))
        return self.table, first, count


def build_plan(sites: list[tuple[str, list[torch.Tensor]]], budget: int) -> PrefetchPlan:
    """A plan over the sites' weight tensors in step order (see ``plan_sites``)."""
    site_bytes = [(name, sum(t.numel() * t.element_size() for t in ts)) for name, ts in sites]
    tensors = dict(sites)
    rows: list[tuple[int, int]] = []
    span: dict[str, tuple[int, int]] = {}
    for name, targets in plan_sites(site_bytes, budget).items():
        first = len(rows)
        for target in targets:
            for t in tensors[target]:
                rows.extend(chunks(t))
        span[name] = (first, len(rows) - first)
    device = sites[0][1][0].device
    table = torch.tensor(rows or [(0, 0)], dtype=torch.int64, device=device)
    return PrefetchPlan(table, span)


@triton.jit
def l2_prefetch_tl(table_ptr, first, count, PREFETCH: tl.constexpr, LANES: tl.constexpr):
    """Rows ``first .. first + count`` of the chunk table, dealt round-robin over the programs.

    Row ``first + pid + programs * j`` goes to lane ``j`` of program ``pid`` (``LANES`` = its
    threads, one bulk prefetch a thread), so every SM's copy engine takes a share. A lane
    past the end re-asks for 16 bytes of row ``first`` (harmless) instead of branching.
    """
    if PREFETCH:
        pid = tl.program_id(0) + tl.num_programs(0) * (
            tl.program_id(1) + tl.num_programs(1) * tl.program_id(2)
        )
        programs = tl.num_programs(0) * tl.num_programs(1) * tl.num_programs(2)
        for start in range(0, count, programs * LANES):
            i = start + pid + programs * tl.arange(0, LANES)
            ok = i < count
            row = first + tl.where(ok, i, 0)
            addr = tl.load(table_ptr + row * 2)
            size = tl.where(ok, tl.load(table_ptr + row * 2 + 1), 16).to(tl.int32)
            tl.inline_asm_elementwise(
                "cp.async.bulk.prefetch.L2.global [$1], $2;\n\tmov.u32 $0, 0;",
                "=r,l,r",
                [addr, size],
                dtype=tl.int32,
                is_pure=False,
                pack=1,
            )


_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def layer_plan(layer) -> PrefetchPlan | None:
    """A ``LayerWeights``' plan over ``WEIGHT_SITES`` (values + scales), built once a budget.

    None where prefetch does not apply (``prefetch_enabled``). The weights are
    written in place by their loaders, so the addresses in the table stay valid.
    """
    dev = layer.wqkv.device
    if not prefetch_enabled(dev):
        return None
    budget = l2_budget(dev)
    cached = _PLANS.get(layer)
    if cached is None or cached[0] != budget:
        sites = [(s, [getattr(layer, s), getattr(layer, f"{s}_scale")]) for s in WEIGHT_SITES]
        cached = (budget, build_plan(sites, budget))
        _PLANS[layer] = cached
    return cached[1]
