"""Does a dependent kernel start before its predecessor ends (programmatic dependent launch)?

Three Triton kernels A -> B -> C on one stream. Each program stamps
``%globaltimer`` when it starts, after ``griddepcontrol.wait`` and when it
ends; between the last two it spins ``--spin-us``. With PDL each kernel lets
its dependents launch first thing, so B's first start should come before A's
last end; B's waits must still end after A's last end. Run eagerly and from a
CUDA graph, with PDL on and off, at a small grid and a GEMV-sized one; prints,
per case, B's first start and first wait end relative to A's last end (us).

    python benchmarks/pdl_probe.py [--spin-us 10]
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from dsv41.common.timer_tl import globaltimer_tl


@triton.jit
def stamp_kernel(stamp_ptr, spin_ns, USE_PDL: tl.constexpr):
    """Stamps (start, waited, end) of this program into ``stamp[pid]``."""
    pid = tl.program_id(0)
    start = globaltimer_tl(pid)
    if USE_PDL:
        gdc_launch_dependents()
        gdc_wait()
    waited = globaltimer_tl(pid)
    now = waited
    while now - waited < spin_ns:
        now = globaltimer_tl(pid)
    tl.store(stamp_ptr + 3 * pid, start)
    tl.store(stamp_ptr + 3 * pid + 1, waited)
    tl.store(stamp_ptr + 3 * pid + 2, now)


def chain(stamps, spin_ns: int, pdl: bool, warps: int) -> None:
    opts = {"launch_pdl": True} if pdl else {}
    for s in stamps:
        stamp_kernel[(s.shape[0],)](s, spin_ns, USE_PDL=pdl, num_warps=warps, **opts)


def case(programs: int, warps: int, pdl: bool, graph: bool, spin_ns: int) -> tuple[float, float]:
    stamps = [torch.zeros(programs, 3, dtype=torch.int64, device="cuda") for _ in range(3)]
    chain(stamps, spin_ns, pdl, warps)  # compile
    torch.cuda.synchronize()
    if graph:
        g = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        with torch.cuda.stream(side), torch.cuda.graph(g, stream=side):
            chain(stamps, spin_ns, pdl, warps)
        g.replay()
    else:
        chain(stamps, spin_ns, pdl, warps)
    torch.cuda.synchronize()
    a, b = stamps[0], stamps[1]
    a_end = int(a[:, 2].max())
    return (int(b[:, 0].min()) - a_end) / 1e3, (int(b[:, 1].min()) - a_end) / 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--spin-us", type=float, default=10.0)
    args = p.parse_args()
    spin_ns = int(args.spin_us * 1e3)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{torch.cuda.get_device_name()}: B's first start / first wait end - A's last end, us")
    print(f"{'grid':>14} {'PDL':>4} {'graph':>6} {'B start':>9} {'B waited':>9}")
    for programs, warps in ((sms, 1), (1120, 4)):
        for pdl in (False, True):
            for graph in (False, True):
                start, waited = case(programs, warps, pdl, graph, spin_ns)
                print(f"{programs:>6} x {warps} w {'on' if pdl else 'off':>4} "
                      f"{'yes' if graph else 'no':>6} {start:>9.2f} {waited:>9.2f}")


if __name__ == "__main__":
    main()
