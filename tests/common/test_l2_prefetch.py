"""The L2 prefetch's plan: the regions asked for, and which chunk each lane asks for.

The prefetch itself is PTX the interpreter cannot run; its chunk arithmetic
(``_region_tl``) runs here in a probe kernel, against the regions cut in Python,
and its SM90 build is checked for the bulk prefetch instruction.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from dsv41.common.l2_prefetch import (
    MAX_REGIONS,
    PREFETCH_ALIGN,
    _region_tl,
    prefetch_args,
    prefetch_regions,
)


def _tensors(seed: int) -> list[torch.Tensor]:
    """Views of odd sizes at odd byte offsets into one buffer."""
    g = torch.Generator().manual_seed(seed)
    buf = torch.empty(1 << 20, dtype=torch.uint8)
    out, at = [], 0
    for _ in range(5):
        at += int(torch.randint(0, 40, (1,), generator=g))
        n = int(torch.randint(1, 90_000, (1,), generator=g))
        out.append(buf[at : at + n])
        at += n
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_regions_cover_each_tensor_inside_16_byte_bounds(seed) -> None:
    tensors = _tensors(seed)
    regions = prefetch_regions(tensors, budget=1 << 40)
    assert len(regions) == len(tensors)
    for t, (a, n) in zip(tensors, regions):
        start, end = t.data_ptr(), t.data_ptr() + t.numel()
        assert a % PREFETCH_ALIGN == 0 and n % PREFETCH_ALIGN == 0 and n > 0
        assert start <= a < start + PREFETCH_ALIGN  # nothing before the tensor is asked for
        assert end - PREFETCH_ALIGN < a + n <= end  # nor after it


def test_budget_cuts_the_last_regions_in_order() -> None:
    tensors = _tensors(3)
    full = prefetch_regions(tensors, budget=1 << 40)
    budget = full[0][1] + full[1][1] // 2 + 5
    cut = prefetch_regions(tensors, budget=budget)
    assert cut[0] == full[0] and cut[1][0] == full[1][0]
    assert len(cut) == 2 and sum(n for _, n in cut) <= budget
    assert cut[1][1] == (budget - full[0][1]) // PREFETCH_ALIGN * PREFETCH_ALIGN


def test_bad_tensors_are_named() -> None:
    t = torch.zeros(64, 64, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"tensors\[1\]: expected contiguous, got strides \(1, 64\)"):
        prefetch_regions([t, t.t()], budget=1 << 20)
    with pytest.raises(ValueError, match=f"tensors: expected at most {MAX_REGIONS}, got 7"):
        prefetch_regions([t] * 7, budget=1 << 20)


def test_nothing_to_prefetch_on_cpu_or_when_switched_off(monkeypatch) -> None:
    t = torch.zeros(4096, dtype=torch.uint8)
    monkeypatch.delenv("DSV41_L2_PREFETCH", raising=False)
    assert prefetch_args([t]) is None  # a CPU tensor
    monkeypatch.setenv("DSV41_L2_PREFETCH", "2")
    with pytest.raises(ValueError, match="DSV41_L2_PREFETCH: expected 0 or 1, got '2'"):
        prefetch_args([t])


@triton.jit
def _chunk_probe_kernel(regions_ptr, addr_ptr, size_ptr, LANES: tl.constexpr, CHUNK: tl.constexpr):
    g = tl.arange(0, LANES)
    addr = tl.zeros((LANES,), tl.int64)
    size = tl.zeros((LANES,), tl.int64)
    start = 0
    for r in tl.static_range(4):
        a = tl.load(regions_ptr + 2 * r)
        n = tl.load(regions_ptr + 2 * r + 1)
        addr, size, start = _region_tl(g, start, a, n, addr, size, CHUNK)
    tl.store(addr_ptr + g, addr)
    tl.store(size_ptr + g, size)


def test_lanes_ask_for_consecutive_chunks_of_each_region_in_turn() -> None:
    """Chunk g of the regions laid end to end: every byte of each region once, in order, in
    chunks of CHUNK bytes but a region's last; an empty region and the lanes past the last
    chunk ask nothing."""
    chunk, lanes = 64, 256
    g = torch.Generator().manual_seed(5)
    regions = [(int(torch.randint(1, 1 << 30, (1,), generator=g)) * 16,
                int(torch.randint(1, 150, (1,), generator=g)) * 16) for _ in range(3)]  # fmt: skip
    regions.append((0, 0))  # prefetch_args' padding: no chunks
    flat = torch.tensor([v for r in regions for v in r], dtype=torch.int64)
    addr = torch.full((lanes,), -7, dtype=torch.int64)
    size = torch.full((lanes,), -7, dtype=torch.int64)
    _chunk_probe_kernel[(1,)](flat, addr, size, LANES=lanes, CHUNK=chunk)
    want = [(a + off, min(chunk, n - off)) for a, n in regions for off in range(0, n, chunk)]
    assert len(want) < lanes
    got = list(zip(addr.tolist(), size.tolist()))
    assert got[: len(want)] == want
    assert all(s == 0 for _, s in got[len(want) :])


SM90_COMPILE = r"""
import json, re, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from dsv41.nvidia.ops.l2_prefetch import l2_prefetch_kernel as fn
sig = {n: "constexpr" if n in ("CHUNK", "LANES") else ("i64" if n[0] == "a" else "i32")
       for n in fn.arg_names}
consts = {(fn.arg_names.index("CHUNK"),): 16384, (fn.arg_names.index("LANES"),): 128}
k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts),
                   target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
print(json.dumps({"prefetch": len(re.findall(r"cp\.async\.bulk\.prefetch\.L2\.global", k.asm["ptx"])),
                  "loads": len(re.findall(r"ld\.global", k.asm["ptx"])), "cubin": len(k.asm["cubin"])}))
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU tests run the real kernel")
def test_prefetch_kernel_builds_for_sm90_with_the_bulk_prefetch() -> None:
    """The nvidia prefetch kernel compiled for SM90 without a GPU: one bulk L2 prefetch in
    its PTX, assembled to a cubin, and no load of anything into the SM."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run([sys.executable, "-c", SM90_COMPILE], env=env, capture_output=True,
                         text=True, cwd=root, timeout=300, check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    counts = json.loads(run.stdout.strip().splitlines()[-1])
    assert counts["prefetch"] == 1 and counts["loads"] == 0 and counts["cubin"] > 0, counts
