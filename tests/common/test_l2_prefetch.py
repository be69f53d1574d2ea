"""The L2 prefetch: its byte table, the no-op path without a GPU, and its SM90 PTX."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dsv41.common.l2_prefetch import l2_prefetch_enabled, l2_prefetched, prefetch_table


def test_table_covers_each_tensor_in_whole_16_byte_units():
    tensors = [torch.empty(1000, 40, dtype=torch.uint8), torch.empty(37, dtype=torch.bfloat16),
               torch.empty(3, dtype=torch.uint8)]
    table = prefetch_table(tensors)
    # 40000 bytes whole; 74 -> 64; 3 bytes are less than one unit: left out
    assert table == [(tensors[0].data_ptr(), 40000), (tensors[1].data_ptr(), 64)]


def test_table_refuses_strided_and_misaligned_tensors():
    w = torch.empty(64, 64, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"tensors\[1\]: expected a contiguous tensor"):
        prefetch_table([w, w.t()])
    with pytest.raises(ValueError, match=r"tensors\[0\]: expected a 16-byte aligned address"):
        prefetch_table([w.view(-1)[3:]])


def test_off_without_a_gpu_and_launches_run_unchanged():
    w = torch.randn(64, 64)
    assert not l2_prefetch_enabled(w.device)
    with l2_prefetched([w]):
        y = w @ w
    torch.testing.assert_close(y, w @ w)


SM90_COMPILE = r"""
import json, re, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from dsv41.common.l2_prefetch import CHUNK_BYTES, LANES, l2_prefetch_kernel as fn
src = ASTSource(fn=fn, signature={"table_ptr": "*i64", "CHUNK": "constexpr", "LANES": "constexpr"},
                constexprs={(1,): CHUNK_BYTES, (2,): LANES})
ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 1}).asm["ptx"]
print(json.dumps({k: len(re.findall(p, ptx)) for k, p in {
    "predicated_prefetch": r"@p cp\.async\.bulk\.prefetch\.L2\.global",
    "prefetch": r"cp\.async\.bulk\.prefetch", "loads": r"ld\.global"}.items()}))
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU tests run it on the real device")
def test_kernel_compiles_to_predicated_bulk_prefetches_for_sm90():
    """One warp, one lane a thread: one predicated bulk prefetch, and no load but the table's."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run([sys.executable, "-c", SM90_COMPILE], env=env, capture_output=True,
                         text=True, cwd=root, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    counts = json.loads(run.stdout.strip().splitlines()[-1])
    assert counts["predicated_prefetch"] == 1 and counts["prefetch"] == 1, counts
    assert counts["loads"] == 2, counts  # the range's address and size
