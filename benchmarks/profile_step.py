"""Where a step's time goes: per-kernel device time of the nvidia step, and a GEMM tile sweep.

``--breakdown``: kernel times (CUPTI, through torch.profiler) of eager steps
over several layers, averaged per layer, for each M. ``--sweep``: each GEMM
site of the rank at M tokens under a set of tile configs, timed from a CUDA
graph that cycles through enough weight copies to miss L2; prints TB/s.
``--attn-sweep``: the attention launches (mega attention + combine) of M
tokens at each key-table split count, the default marked. ``--chain``: the
graph-replayed step (``dsv41 bench``'s layers and steps, weights from HBM)
cut after each of its launches: what each launch adds to the step in the graph,
overlaps (PDL, the side stream) included. ``--timeline``: the same whole graph replayed
under the profiler (CUPTI): each kernel of one layer step, its start and end after the end
of the step before, so PDL's early starts and every kernel's own span show. ``--gemv-trace``:
the same graph with every GEMM program stamping its start, the end of its PDL wait and its end
(``Scratch.trace``): which programs started only after their predecessor ended, and how long a
program runs past its wait. ``--attn-trace``: that with the attention and combine programs'
stamps too (``mega_attention.trace_buffer``), on the same clock. ``--l2``: each GEMM site with
the step's tiles at M, back to back in a graph, its weights L2-resident (one copy) against
rotated copies from HBM, beside an empty launch: equal times mean HBM is not the bound.

    python benchmarks/profile_step.py --tp 4 --tokens 1,48 --breakdown --sweep --attn-sweep
"""

from __future__ import annotations

import argparse
import itertools
from collections import defaultdict

import torch
import triton
import triton.language as tl

from dsv41.bench import replay_seconds
from dsv41.common.geometry import Dims
from dsv41.common.scenario import make_scenario
from dsv41.common.weights import LayerWeights

COPIES = 8  # weight copies a sweep graph cycles through (>= 80 MB: past the 60 MB L2)


def graph_us(run, calls: int = 1, replays: int = 20) -> float:
    """Median us of one of the ``calls`` calls that ``run`` makes, from a captured CUDA graph."""
    return replay_seconds(run, replays) * 1e6 / calls


def attention_sweep(dims: Dims, tokens: list[int]) -> None:
    from dsv41.common.rope import rope_tables
    from dsv41.nvidia.ops.mega_attention import KEY_BLOCK, attention_splits, mega_attention
    from dsv41.nvidia.ops.launch import bucket_for, sm_count

    model = dims.model
    cos, sin = rope_tables(model, 1, torch.device("cuda"))
    sink = torch.randn(dims.heads, device="cuda")
    for m in tokens:
        sc = make_scenario(dims, 1, m, seed=m, device="cuda")
        q = torch.randn(m, dims.q_rows, device="cuda").bfloat16()
        keys = sc.key_table.shape[1]
        default, _ = attention_splits(bucket_for(m), dims.heads, keys, sm_count(q.device))
        blocks = -(-keys // KEY_BLOCK)
        print(f"\nattention, M = {m}, {keys} keys: us per step (mega attention + combine)")
        for splits in sorted({2, 4, 5, 8, 10, 16, 20, blocks, default}):
            if splits > blocks:
                continue
            us = graph_us(lambda s=splits, q=q, sc=sc: mega_attention(
                q, sc.positions, sc.key_table, sc.window_cache, sc.compressed_cache, sink, cos,
                sin, softmax_scale=model.softmax_scale, heads_per_group=model.heads_per_group,
                splits=s))  # fmt: skip
            print(f"  splits {splits:3d}: {us:7.2f} us{'  (default)' if splits == default else ''}")


def breakdown(dims: Dims, tokens: list[int], layers: int = 4) -> None:
    from dsv41.nvidia.step import nvidia_step

    lws = []
    for i in range(layers):
        lw = LayerWeights(dims, 0, 1, device="cuda")
        lw.dummy_load(i)
        lws.append(lw)
    for m in tokens:
        scs = [make_scenario(dims, 1, m, seed=i, device="cuda") for i in range(layers)]

        def run(scs=scs):
            for lw, sc in zip(lws, scs):
                nvidia_step(lw, sc)

        run()
        torch.cuda.synchronize()
        reps = 10
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                run()
            torch.cuda.synchronize()
        per_kernel: dict[str, list[float]] = defaultdict(list)
        for ev in prof.events():
            if ev.device_type == torch.autograd.DeviceType.CUDA:
                per_kernel[ev.name[:60]].append(ev.device_time)
        total = 0.0
        print(f"\nM = {m}: kernel time per layer step (us)")
        for name, ts in sorted(per_kernel.items(), key=lambda kv: -sum(kv[1])):
            per_step = sum(ts) / (reps * layers)
            total += per_step
            print(f"  {per_step:8.2f}  x{len(ts) // (reps * layers):<3} {name}")
        print(f"  {total:8.2f}  total")


def chain(dims: Dims, tokens: list[int], n_layers: int | None = None) -> None:
    from stream import StepLaunches  # benchmarks/stream.py: the step's launches one by one

    from dsv41.bench import graph_layers, graph_scenarios, step_function, time_graph

    lws = graph_layers(dims, 0, n_layers)  # the bench's graph: the model's layers, past the L2
    with StepLaunches(step_function("nvidia")) as launches:
        for m in tokens:
            scs = graph_scenarios(dims, lws, m)
            launches.keep = None
            launches(lws[0], scs[0])  # one whole step: which launches it makes, in order
            names = launches.stages
            print(f"\nM = {m}: the graph-replayed step cut after each launch, us a layer step")
            before = 0.0
            for n in range(1, len(names) + 1):
                launches.keep = set(range(n))
                us = time_graph(launches, lws, scs, 50) * 1e6 / len(lws)
                print(f"  through {names[n - 1]:9s} {us:7.2f}  (+{us - before:5.2f})")
                before = us


def timeline(dims: Dims, tokens: list[int], n_layers: int | None = None, replays: int = 6) -> None:
    from dsv41.bench import capture_graph, graph_layers, graph_scenarios, layer_steps, step_function

    lws = graph_layers(dims, 0, n_layers)  # the bench's graph: the model's layers, past the L2
    step = step_function("nvidia")
    for m in tokens:
        graph = capture_graph(layer_steps(step, lws, graph_scenarios(dims, lws, m)))
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(replays):
                graph.replay()
            torch.cuda.synchronize()
        kernels = sorted((ev.time_range.start, ev.time_range.end, ev.name) for ev in prof.events()
                         if ev.device_type == torch.autograd.DeviceType.CUDA)  # fmt: skip
        per_step, rem = divmod(len(kernels), replays * len(lws))
        if rem or not per_step:
            print(f"\nM = {m}: {len(kernels)} kernels for {replays} x {len(lws)} steps: no timeline")
            continue
        first = (replays // 2 * len(lws) + len(lws) // 2) * per_step  # a step in the middle
        t0 = max(end for _, end, _ in kernels[first - per_step:first])  # the step before ends
        print(f"\nM = {m}: one layer step's kernels in the replayed graph, us after the step "
              f"before ended (start, end, span)")
        for start, end, name in kernels[first:first + per_step]:
            print(f"  {start - t0:7.2f} {end - t0:7.2f} {end - start:7.2f}  {name[:48]}")


def gemv_trace(dims: Dims, tokens: list[int], attention: bool = False, n_layers: int | None = None,
               replays: int = 5) -> None:
    from dsv41.bench import capture_graph, graph_layers, graph_scenarios, layer_steps, step_function
    from dsv41.nvidia.ops import mega_attention as attn
    from dsv41.nvidia.ops.mx_gemm import TRACE_FIELDS, scratch_for
    from dsv41.nvidia.tuning import GEMM_SITES

    lws = graph_layers(dims, 0, n_layers)  # the bench's graph: the last layer's stamps stay
    step = step_function("nvidia")

    def q(v, p):
        return float(v.quantile(p))

    def by_count(values, counts):
        """'count: median of values (programs)' for each count, ascending."""
        return ", ".join(f"{int(c)}: {q(values[counts == c], .5):.2f} ({int((counts == c).sum())})"
                         for c in torch.unique(counts).tolist())  # fmt: skip

    try:
        for m in tokens:
            traces = {}
            for site in GEMM_SITES:
                traces[site] = torch.zeros(1 << 14, TRACE_FIELDS, dtype=torch.int64,
                                           device="cuda")  # fmt: skip
                scratch_for(site).trace = traces[site]
            if attention:
                attn.trace_buffer = torch.zeros(1 << 14, attn.TRACE_FIELDS, dtype=torch.int64,
                                                device="cuda")  # fmt: skip
            graph = capture_graph(layer_steps(step, lws, graph_scenarios(dims, lws, m)))
            for _ in range(replays):
                graph.replay()
            torch.cuda.synchronize()
            print(f"\nM = {m}: each GEMM's programs in the last layer's step of a replay, us after "
                  f"Wqkv's first wait ended; 'late': programs that started after the site's "
                  f"first wait ended (its predecessor's end + ~0.5 us)")
            print("  site   progs SMs most/SM | start p0 p50 p100 | late | waited p0 p100 "
                  "| end p50 p100 | after wait p50 p100 | K loop p50 p100 | split-K sum and "
                  "epilogue p50 p100")
            t0 = None
            for site in GEMM_SITES:
                t = traces[site]
                t = t[t[:, 0] > 0].double()
                if not len(t):  # a site the step did not launch (wo_a in the combine's)
                    print(f"  {site:6s} not launched")
                    continue
                t0 = t[:, 1].min() if t0 is None else t0
                start, waited, end = ((t[:, i] - t0) / 1e3 for i in range(3))
                first_wait = waited.min()
                per_sm = torch.bincount(t[:, 3].long())
                work = end - waited
                loop = (t[:, 4] - t[:, 1]) / 1e3  # the K loop, after the wait
                tail = (t[:, 2] - t[:, 4]) / 1e3  # the split-K sum (ticket) and the epilogue
                sms = f"{int((per_sm > 0).sum()):3d} {int(per_sm.max()):3d}"
                print(f"  {site:6s} {len(t):5d} {sms} "
                      f"| {q(start, 0):6.2f} {q(start, .5):6.2f} {q(start, 1):6.2f} "
                      f"| {int((start > first_wait).sum()):4d} "
                      f"| {q(waited, 0):6.2f} {q(waited, 1):6.2f} | {q(end, .5):6.2f} "
                      f"{q(end, 1):6.2f} | {q(work, .5):5.2f} {q(work, 1):5.2f} "
                      f"| {q(loop, .5):5.2f} {q(loop, 1):5.2f} | {q(tail, .5):5.2f} "
                      f"{q(tail, 1):5.2f}")
                # Past the wait by how many of the site's programs share the SM (one kernel's
                # programs do the same work: a longer time with more of them is issue-bound).
                print(f"         after wait by its programs on the SM: "
                      f"{by_count(work, per_sm[t[:, 3].long()])}")
                if site in ("wqkv", "wo_a"):  # the next GEMM's programs, resident early by PDL
                    nxt = traces[GEMM_SITES[GEMM_SITES.index(site) + 1]]
                    nxt = torch.bincount(nxt[nxt[:, 0] > 0][:, 3], minlength=1024)
                    print(f"         after wait by the next GEMM's programs on the SM: "
                          f"{by_count(work, nxt[t[:, 3].long()])}")
            if attention:  # rows of both launches: attention's have field 4 (loop done) set
                t = attn.trace_buffer
                t = t[t[:, 0] > 0]
                print("  attention and combine programs, same clock: p0 / p50 / p100 of each "
                      "stamp")
                names = ("start", "keys in", "waited", "q ready", "loop done", "end", "SM",
                         "scores")  # fmt: skip
                launches = {"attention": t[t[:, 4] > 0], "combine": t[t[:, 4] == 0]}
                for (name, rows), fields in zip(launches.items(),
                                                ((0, 1, 2, 3, 7, 4, 5), (0, 2, 5))):  # fmt: skip
                    if not len(rows):  # a launch the step did not make
                        print(f"  {name:9s} not launched")
                        continue
                    cells = " | ".join(
                        f"{names[f]} {q(v, 0):.2f} {q(v, .5):.2f} {q(v, 1):.2f}"
                        for f in fields if bool((rows[:, f] > 0).all())
                        for v in [(rows[:, f].double() - t0) / 1e3]
                    )  # fmt: skip
                    sms = int(torch.bincount(rows[:, 6]).gt(0).sum()) if len(rows) else 0
                    print(f"  {name:9s} {len(rows):4d} progs {sms:3d} SMs | {cells}")
                # Each program's own intervals in its SM's cycles (%clock64 at the stamps, field
                # f + CLOCK; q's raw load at Q_LOADED), p50 / p100 over the programs.
                c = attn.CLOCK
                steps = (("start", c), ("waited", c + 2), ("q loaded", attn.Q_LOADED),
                         ("q ready", c + 3), ("scores", c + 7), ("loop done", c + 4),
                         ("end", c + 5))  # fmt: skip
                for name, rows in launches.items():
                    have = [(n, f) for n, f in steps if len(rows) and bool((rows[:, f] > 0).all())]
                    cells = " | ".join(
                        f"{a} -> {b} {q(d, .5):.0f} {q(d, 1):.0f}"
                        for (a, f), (b, g) in itertools.pairwise(have)
                        for d in [(rows[:, g] - rows[:, f]).double()]
                    )  # fmt: skip
                    if cells:
                        print(f"  {name:9s} cycles, p50 / p100: {cells}")
                # The attention programs that ended last: their row (tile * splits + split: the
                # split itself at one head tile) and their stamps, to tell whether some splits
                # (compressed or window keys) run late.
                full = attn.trace_buffer
                ids = torch.nonzero((full[:, 0] > 0) & (full[:, 4] > 0)).flatten()
                if len(ids):
                    att = full[ids]
                    order = torch.argsort(att[:, 5], descending=True)[:6]
                    last = ", ".join(
                        f"{int(ids[i])}: keys {(att[i, 1] - t0) / 1e3:.2f} q "
                        f"{(att[i, 3] - t0) / 1e3:.2f} scores {(att[i, 7] - t0) / 1e3:.2f} "
                        f"end {(att[i, 5] - t0) / 1e3:.2f}"
                        for i in order.tolist()
                    )  # fmt: skip
                    print(f"  attention's last to end (row: stamps): {last}")
                # Attention's loop (q ready to loop done) by the wo_a programs on the other SM
                # of its pair (SMs 2i and 2i + 1 share a TPC): alone on its SM, a program's
                # neighbour may still stream weights beside it.
                wo_a_rows = traces["wo_a"][traces["wo_a"][:, 0] > 0]
                if len(ids) and len(wo_a_rows):
                    on_sm = torch.bincount(wo_a_rows[:, 3], minlength=1024)
                    loop = (att[:, 4] - att[:, 3]).double() / 1e3
                    pair = on_sm[att[:, 6] ^ 1]
                    print(f"  attention's loop by wo_a's programs on the paired SM: "
                          f"{by_count(loop, pair)}")
                # Where wo_a's programs sit against attention's and the combine's (all launched
                # early by PDL): SMs holding both, and the most programs of the three on one SM.
                held = set(t[:, 6].tolist())
                wo_a_sms = wo_a_rows[:, 3].tolist()
                if not wo_a_sms:
                    continue
                shared = len(held & set(wo_a_sms))
                both = torch.bincount(torch.tensor(list(t[:, 6].tolist()) + wo_a_sms))
                print(f"  wo_a on {len(set(wo_a_sms))} SMs, {shared} of them also attention's or "
                      f"the combine's; most programs of the three on one SM: {int(both.max())}")
    finally:
        for site in GEMM_SITES:
            scratch_for(site).trace = None
        attn.trace_buffer = None


def sweep(dims: Dims, tokens: list[int], only: list[str] | None = None) -> None:
    from dsv41.common.mx import E4M3
    from dsv41.nvidia.ops.launch import sm_count
    from dsv41.nvidia.ops.mx_gemm import GemmConfig, Scratch, gemm_config, mx_gemm
    from dsv41.nvidia.tuning import gemm_shapes

    sites = gemm_shapes(dims)
    sms = sm_count(torch.device("cuda"))
    for m in tokens:
        for site, (n, k, npg, quant) in sites.items():
            if only and site not in only:
                continue
            groups = 1 if npg is None else n // npg
            ws = [(torch.randn(n, k, device="cuda").clamp(-400, 400).to(E4M3),
                   torch.randint(118, 124, (n, k // 32), dtype=torch.uint8, device="cuda"))
                  for _ in range(COPIES)]
            a = (torch.randn(m, groups * k, device="cuda").to(E4M3),
                 torch.randint(120, 128, (m, groups * k // 32), dtype=torch.uint8, device="cuda"))
            out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
            out8 = (torch.empty(m, n, dtype=E4M3, device="cuda"),
                    torch.empty(m, n // 32, dtype=torch.uint8, device="cuda")) if quant else None
            default = gemm_config(m, n, k, n_per_group=npg or n, quant_out=quant, sms=sms)
            mma = gemm_config(m, n, k, n_per_group=npg or n, quant_out=quant, sms=sms, gemv_ok=False)
            configs = {default, mma}
            # The CUDA-core loop: one weight tile a program, tile shape x warps (a tile of the
            # whole K, where K is a power of two, needs no split-K sum).
            for bn, bk, warps in itertools.product((8, 16, 32, 64), (256, 512, 1024, 2048, 4096),
                                                   (4, 8)):
                if k % bk or (npg or n) % bn or (quant and bn % 32) or bn * bk > 32768:
                    continue
                configs.add(GemmConfig(triton.next_power_of_2(m), bn, bk, k // bk, warps, 1,
                                       gemv=True))  # fmt: skip
            # ... and programs of a few rows over the whole K in unrolled steps (no split-K sum).
            for bn, bk, warps in itertools.product((1, 2, 4, 8), (256, 512, 1024), (4, 8)):
                steps = k // bk
                if k % bk or (npg or n) % bn or quant or not 2 <= steps <= 8 or bn * k > 16384:
                    continue
                configs.add(GemmConfig(triton.next_power_of_2(m), bn, bk, 1, warps, 1,
                                       gemv=True, k_steps=steps))  # fmt: skip
            # K steps a program x pipeline depth: with stages >= steps every load of a program
            # is issued before its first multiply.
            for bn, bk, iters, st in itertools.product((32, 64), (64, 128, 256), (1, 2, 4, 8),
                                                       (2, 3, 4, 6)):
                if k % (bk * iters) or (npg or n) % bn or (quant and bn % 32) or st > iters + 1:
                    continue
                sk = k // (bk * iters)
                if not 132 <= (n // bn) * sk <= 132 * 4:
                    continue
                configs.add(GemmConfig(mma.block_m, bn, bk, sk, 4, st))
            results = []
            scratch = Scratch()
            for cfg in sorted(configs, key=str):
                try:
                    def run(ws=ws, a=a, out=out, out8=out8, npg=npg, scratch=scratch, cfg=cfg):
                        for w, s in ws:
                            mx_gemm(a, w, s, out=out, out8=out8, n_per_group=npg, scratch=scratch,
                                    config=cfg)
                    results.append((graph_us(run, COPIES), cfg))
                except Exception as e:  # noqa: BLE001 -- a config that fails to compile is reported
                    print(f"  {site} {cfg}: {type(e).__name__}: {str(e)[:80]}")
            results.sort(key=lambda r: r[0])
            src = torch.empty(COPIES, n * k, dtype=torch.uint8, device="cuda")
            dst = torch.empty_like(src)
            copy_us = graph_us(lambda src=src, dst=dst: [dst[i].copy_(src[i]) for i in range(COPIES)],
                               COPIES)  # fmt: skip
            print(f"\n{site}: a torch copy of the same bytes takes {copy_us:.2f} us "
                  f"({2 * n * k / copy_us / 1e6:.2f} TB/s read + write)")
            nbytes = n * k * (1 + 1 / 32)
            d_us = next(us for us, c in results if c == default)
            print(f"\n{site} M={m} N={n} K={k}: default {d_us:.2f} us ({nbytes / d_us / 1e6:.2f} TB/s) {default}")
            m_us = next(us for us, c in results if c == mma)
            print(f"  MMA loop default {m_us:.2f} us ({nbytes / m_us / 1e6:.2f} TB/s) {mma}")
            for us, cfg in results[:6]:
                print(f"  {us:7.2f} us {nbytes / us / 1e6:5.2f} TB/s  {cfg}")
            # The default again with one weight copy: weights L2-resident after the first run.
            l2_us = graph_us(lambda a=a, w=ws[0], out=out, out8=out8, npg=npg, scratch=scratch,
                             cfg=default: mx_gemm(a, *w, out=out, out8=out8, n_per_group=npg,
                                                  scratch=scratch, config=cfg))  # fmt: skip
            print(f"  default, weights in L2: {l2_us:.2f} us")


@triton.jit
def _empty_kernel(flag_ptr, program):
    if tl.program_id(0) == program:  # never: a launch that does nothing
        tl.store(flag_ptr, 1)


def l2_or_hbm(dims: Dims, tokens: list[int]) -> None:
    from dsv41.common.mx import E4M3
    from dsv41.nvidia.ops.mx_gemm import Dequantized, mx_gemm, scratch_for
    from dsv41.nvidia.tuning import GEMM_SITES, gemm_shapes, tuning_for

    dev = torch.device("cuda")
    flag = torch.zeros(1, dtype=torch.int32, device=dev)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    empty = graph_us(lambda: [_empty_kernel[(sms,)](flag, -1) for _ in range(COPIES)],
                     calls=COPIES)  # fmt: skip
    print(f"an empty launch of {sms} programs, {COPIES} back to back: {empty:.2f} us")
    for m in tokens:
        t = tuning_for(dims, dev, m)
        print(f"\nM = {m}: us a launch, the step's tiles (PDL off: back to back)")
        for site in GEMM_SITES:
            n, k, npg, quant = gemm_shapes(dims)[site]
            cfg = getattr(t, site)
            groups = 1 if npg is None else n // npg
            ws = [(torch.randn(n, k, device=dev).clamp(-400, 400).to(E4M3),
                   torch.randint(118, 124, (n, k // 32), dtype=torch.uint8, device=dev))
                  for _ in range(COPIES)]  # fmt: skip
            x = torch.randn(m, groups * k, device=dev).bfloat16()
            a = x if cfg.gemv else Dequantized(x)
            out8 = (torch.empty(m, n, dtype=E4M3, device=dev),
                    torch.empty(m, n // 32, dtype=torch.uint8, device=dev)) if quant else None
            us = {}
            for name, copies in (("L2", ws[:1] * COPIES), ("HBM", ws)):
                us[name] = graph_us(lambda copies=copies: [
                    mx_gemm(a, *w, out8=out8, n_per_group=npg, config=cfg, pdl=False,
                            scratch=scratch_for(site)) for w in copies], calls=COPIES)  # fmt: skip
            mb = n * k * 33 / 32 / 1e6
            print(f"  {site:5s} {mb:6.2f} MB  weights in L2 {us['L2']:6.2f} us  from HBM "
                  f"{us['HBM']:6.2f} us ({mb / us['HBM']:.2f} TB/s)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="dsv41-flash")
    p.add_argument("--tp", type=int, default=4)
    p.add_argument("--tokens", default="1,48")
    p.add_argument("--breakdown", action="store_true")
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--sites", default=None, help="comma-separated GEMM sites to sweep (default all)")
    p.add_argument("--attn-sweep", action="store_true")
    p.add_argument("--chain", action="store_true")
    p.add_argument("--timeline", action="store_true")
    p.add_argument("--gemv-trace", action="store_true")
    p.add_argument("--attn-trace", action="store_true", help="--gemv-trace with attention's")
    p.add_argument("--l2", action="store_true", help="each GEMM with its weights in L2 and not")
    p.add_argument("--layers", type=int, default=None,
                   help="layers in the graph of --chain, --timeline and the traces (default: the "
                        "bench's, the model's layers)")
    args = p.parse_args()
    dims = Dims.of(args.config, args.tp)
    tokens = [int(t) for t in args.tokens.split(",")]
    if args.breakdown:
        breakdown(dims, tokens)
    if args.sweep:
        sweep(dims, tokens, args.sites.split(",") if args.sites else None)
    if args.attn_sweep:
        attention_sweep(dims, tokens)
    if args.chain:
        chain(dims, tokens, args.layers)
    if args.timeline:
        timeline(dims, tokens, args.layers)
    if args.l2:
        l2_or_hbm(dims, tokens)
    if args.gemv_trace or args.attn_trace:
        gemv_trace(dims, tokens, attention=args.attn_trace, n_layers=args.layers)


if __name__ == "__main__":
    main()
