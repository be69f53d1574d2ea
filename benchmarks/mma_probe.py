"""Probe: one MX block's dots on e4m3 ``mma.sync`` from a Triton kernel (GPU; no kernel of the
step uses it).

The one-token GEMV programs are issue-bound after their PDL wait (BENCHMARKS.md, session 19):
on CUDA cores a weight byte costs about 2.5 instructions at best (e4m3 -> f16 pairs, f16 ->
f32, an FMA) and 4 to 7 with the rest. ``mma.sync.m16n8k32`` on e4m3 operands takes 16 weight
rows x 32 columns (one MX block, 512 bytes) a warp instruction, the weights' own bytes as its
A fragment, the activation's block as column 0 of B, fp32 sums. Triton has no such dot at one
token, so the probe issues the instruction through ``tl.inline_asm_elementwise`` on tensors of
one element a thread (``tl.arange(0, 32)`` in one warp: lane = element), each lane loading its
own fragment. On SM90 ptxas runs it as two f16 MMAs after converting both fragments (there is
no e4m3 ``mma.sync`` there; session 19's wo_a on it was slower than the CUDA-core loop).

The fragment's columns are a permutation of the block's 32: lane (g = lane // 4, t = lane % 4)
holds bytes ``8t .. 8t + 7`` of rows g and g + 8 (two 4-byte words each: A's slots ``4t ..``
and ``16 + 4t ..``), and B's column 0 (lanes g = 0) the same bytes of the activation, so a
lane's two words are adjacent in memory. D's column 0 (lanes t = 0) holds rows g and g + 8.

    python benchmarks/mma_probe.py [--blocks 64] [--trials 200]

prints, over random MXFP8 blocks (values only: a block's scales multiply its whole sum), how
often the tensor-core sum equals the fp32 sum of the exact products, and the largest difference
from the exact sum over the sum of the products' magnitudes (Hopper's fp8 MMA is known to keep
fewer accumulator bits than fp32).
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from dsv41.common.mx import E4M3

_MMA = tl.constexpr(
    "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {$0, $1, $2, $3}, {$4, $5, $6, $7}, "
    "{$8, $9}, {$10, $11, $12, $13};"
)


@triton.jit
def mma_block_kernel(w_ptr, a_ptr, out_ptr):
    """``out[b, r] = sum_k w[b, r, k] a[b, k]`` for block ``b = pid``: w e4m3 ``[blocks, 16,
    32]``, a e4m3 ``[blocks, 32]``, out fp32 ``[blocks, 16]``; one warp, one MMA."""
    b = tl.program_id(0)
    lane = tl.arange(0, 32)
    g = lane // 4
    t = lane % 4
    w = w_ptr.to(tl.pointer_type(tl.int32)) + b * (16 * 32 // 4)
    a0 = tl.load(w + g * 8 + 2 * t)  # row g, bytes 8t .. 8t + 3
    a1 = tl.load(w + (g + 8) * 8 + 2 * t)  # row g + 8
    a2 = tl.load(w + g * 8 + 2 * t + 1)  # row g, bytes 8t + 4 .. 8t + 7
    a3 = tl.load(w + (g + 8) * 8 + 2 * t + 1)
    x = a_ptr.to(tl.pointer_type(tl.int32)) + b * 8
    col0 = tl.where(g == 0, lane, -1) >= 0  # B's column 0: the activation; the rest zero
    b0 = tl.load(x + 2 * t, mask=col0, other=0)
    b1 = tl.load(x + 2 * t + 1, mask=col0, other=0)
    z = tl.zeros([32], tl.float32)
    d0, _d1, d2, _d3 = tl.inline_asm_elementwise(  # D columns 0 (d0, d2) and 1 (the _s)
        _MMA, "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", [a0, a1, a2, a3, b0, b1, z, z, z, z],
        dtype=(tl.float32, tl.float32, tl.float32, tl.float32), is_pure=True, pack=1,
    )  # fmt: skip
    first = tl.where(t == 0, lane, -1) >= 0  # D's column 0
    tl.store(out_ptr + b * 16 + g, d0, mask=first)
    tl.store(out_ptr + b * 16 + g + 8, d2, mask=first)


def random_e4m3(shape, gen: torch.Generator) -> torch.Tensor:
    """Random finite e4m3 values of every exponent (bytes, NaN codes replaced)."""
    raw = torch.randint(0, 256, shape, generator=gen, dtype=torch.int32).to(torch.uint8)
    raw[(raw & 0x7F) == 0x7F] = 0x3C  # NaN -> 1.5
    return raw.view(E4M3)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=64)
    p.add_argument("--trials", type=int, default=200)
    args = p.parse_args()
    gen = torch.Generator().manual_seed(19)
    equal = total = 0
    worst = 0.0
    for _ in range(args.trials):
        w = random_e4m3((args.blocks, 16, 32), gen)
        a = random_e4m3((args.blocks, 32), gen)
        exact = (w.double() * a.double()[:, None, :]).sum(-1)  # the exact sum
        want = (w.float() * a.float()[:, None, :]).sum(-1, dtype=torch.float32)
        got = torch.empty(args.blocks, 16, dtype=torch.float32, device="cuda")
        mma_block_kernel[(args.blocks,)](w.cuda(), a.cuda(), got, num_warps=1)
        got = got.cpu()
        equal += int((got == want).sum())
        total += got.numel()
        scale = (w.double().abs() * a.double().abs()[:, None, :]).sum(-1).clamp_min(1e-30)
        worst = max(worst, float(((got.double() - exact).abs() / scale).max()))
    print(f"mma e4m3 m16n8k32: {equal} / {total} block sums equal the fp32 sum of the exact "
          f"products; largest difference from the exact sum, over the sum of |products|: "
          f"{worst:.3e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
