"""The L2 prefetch plan: which sites each launch asks for, and the chunk table's coverage."""

from __future__ import annotations

import pytest
import torch

from dsv41.common.l2_prefetch import PREFETCH_CHUNK, build_plan, chunks, plan_sites

MB = 2**20


def test_all_later_sites_fit_in_a_large_budget() -> None:
    sites = [("a", 9 * MB), ("b", 11 * MB), ("c", 9 * MB), ("d", 11 * MB)]
    assert plan_sites(sites, 32 * MB) == {"a": ["b", "c", "d"], "b": [], "c": [], "d": []}


def test_budget_rolls_the_window_forward() -> None:
    # 22 + 17 > 30: the first launch asks for b only; b's launch for c; c's for d.
    sites = [("a", 18 * MB), ("b", 22 * MB), ("c", 17 * MB), ("d", 22 * MB)]
    plan = plan_sites(sites, 30 * MB)
    assert plan == {"a": ["b"], "b": ["c"], "c": ["d"], "d": []}
    # every later site is asked for exactly once, and never more than the budget is resident
    asked = [s for targets in plan.values() for s in targets]
    assert sorted(asked) == ["b", "c", "d"]


def test_a_site_larger_than_the_budget_is_never_prefetched() -> None:
    sites = [("a", 1 * MB), ("b", 40 * MB), ("c", 1 * MB)]
    assert plan_sites(sites, 30 * MB) == {"a": [], "b": ["c"], "c": []}


@pytest.mark.parametrize("numel", [1, 15, 16, 17, PREFETCH_CHUNK, 3 * PREFETCH_CHUNK + 48])
def test_chunks_cover_the_tensor_and_stay_inside_it(numel: int) -> None:
    t = torch.empty(numel, dtype=torch.uint8)
    got = chunks(t)
    start, nbytes = t.data_ptr(), numel // 16 * 16
    assert sum(size for _, size in got) == nbytes
    assert all(0 < size <= PREFETCH_CHUNK and size % 16 == 0 for _, size in got)
    assert all(a % 16 == 0 and start <= a and a + size <= start + numel for a, size in got)
    assert [a for a, _ in got] == sorted(a for a, _ in got)


def test_chunks_reject_a_misaligned_view() -> None:
    t = torch.empty(1024, dtype=torch.uint8)[1:]
    with pytest.raises(ValueError, match="prefetch tensor: expected .* 16-B aligned"):
        chunks(t)


def test_plan_rows_point_at_the_planned_sites_tensors() -> None:
    w = {s: torch.empty(n, dtype=torch.uint8) for s, n in (("a", 5000), ("b", 70000), ("c", 40000))}
    sc = {s: torch.empty(n // 32, dtype=torch.uint8) for s, n in (("a", 5000), ("b", 70000), ("c", 40000))}
    sites = [(s, [w[s], sc[s]]) for s in ("a", "b", "c")]
    plan = build_plan(sites, budget=10**9)
    table, first, count = plan.args("a")
    rows = table[first : first + count].tolist()
    expect = chunks(w["b"]) + chunks(sc["b"]) + chunks(w["c"]) + chunks(sc["c"])
    assert [tuple(r) for r in rows] == expect
    assert plan.args("b")[2] == 0 and plan.args("c")[2] == 0
