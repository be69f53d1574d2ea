"""One GEMM site of the rank at M tokens, launched a few times (for ncu / compute-sanitizer).

    ncu --clock-control none -k regex:mx_gemm -s 3 -c 1 python benchmarks/gemm_once.py --site wqkv
"""

from __future__ import annotations

import argparse

import torch

from dsv41.common.geometry import Dims
from dsv41.common.mx import E4M3
from dsv41.nvidia.ops.mx_gemm import mx_gemm
from dsv41.nvidia.tuning import GEMM_SITES, gemm_shapes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="dsv41-flash")
    p.add_argument("--tp", type=int, default=4)
    p.add_argument("--tokens", type=int, default=1)
    p.add_argument("--site", default="wqkv", choices=GEMM_SITES)
    p.add_argument("--launches", type=int, default=6)
    args = p.parse_args()
    n, k, npg, quant = gemm_shapes(Dims.of(args.config, args.tp))[args.site]
    groups = 1 if npg is None else n // npg
    w = torch.randn(n, k, device="cuda").clamp(-400, 400).to(E4M3)
    ws = torch.randint(118, 124, (n, k // 32), dtype=torch.uint8, device="cuda")
    a = (torch.randn(args.tokens, groups * k, device="cuda").to(E4M3),
         torch.randint(120, 128, (args.tokens, groups * k // 32), dtype=torch.uint8, device="cuda"))
    out8 = (torch.empty(args.tokens, n, dtype=E4M3, device="cuda"),
            torch.empty(args.tokens, n // 32, dtype=torch.uint8, device="cuda")) if quant else None
    for _ in range(args.launches):
        mx_gemm(a, w, ws, out8=out8, n_per_group=npg)
    torch.cuda.synchronize()
    print(f"{args.site}: N {n} K {k} M {args.tokens}: {args.launches} launches done")


if __name__ == "__main__":
    main()
