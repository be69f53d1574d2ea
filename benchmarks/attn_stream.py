"""nvidia attention alone (mega attention + combine) with its records from HBM: us a call and the
records' TB/s, for each token count and record format.

One CUDA graph holds a call for each of ``--copies`` scenarios (own caches, key tables and q), so
from about 16 tokens on the records a replay reads are past the L2 (at 1 and 4 tokens they fit in
it); the time is the replay's median divided by the copies.
TB/s counts the bytes of the valid keys' records (what the kernel must read).

    PYTHONPATH=$PWD python benchmarks/attn_stream.py --tp 4 --tokens 1,4,16,48
"""

from __future__ import annotations

import argparse

import torch

from dsv41.bench import replay_seconds
from dsv41.common.geometry import Dims
from dsv41.common.rope import rope_tables
from dsv41.common.scenario import make_scenario


def main() -> None:
    from dsv41.nvidia.ops import mega_attention as ma
    from dsv41.nvidia.ops.launch import sm_count

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="dsv41-flash")
    p.add_argument("--tp", type=int, default=4)
    p.add_argument("--tokens", default="1,4,16,48")
    p.add_argument("--formats", default="fp8_ds_mla,fp8_mx")
    p.add_argument("--copies", type=int, default=8, help="scenarios a graph cycles through")
    p.add_argument("--splits", default="", help="comma-separated split counts to try too")
    p.add_argument("--replays", type=int, default=30)
    args = p.parse_args()
    dims = Dims.of(args.config, args.tp)
    model = dims.model
    layer = next(i for i, r in enumerate(model.compress_ratios) if r)
    cos, sin = rope_tables(model, layer, torch.device("cuda"))
    sink = torch.randn(dims.heads, device="cuda")
    sms = sm_count(torch.device("cuda"))
    print(f"tp {args.tp}: {dims.heads} heads a rank, {args.copies} copies a graph")
    print(" fmt         M  splits      us   TB/s  (valid-key records MB)")
    for fmt in args.formats.split(","):
        for m in (int(t) for t in args.tokens.split(",")):
            scs = [make_scenario(dims, layer, m, fmt=fmt, seed=100 * i + m, device="cuda",
                                 compressed_rows=max(2 * model.topk, m * model.topk))
                   for i in range(args.copies)]  # fmt: skip
            qs = [torch.randn(m, dims.q_rows, device="cuda").bfloat16() for _ in scs]
            keys = scs[0].key_table.shape[1]
            record = scs[0].window_cache.fmt.record_bytes
            valid = sum(int((sc.key_table != -1).sum()) for sc in scs) / len(scs)
            mb = valid * record / 1e6
            default = ma.attention_tuning(m, dims.heads, keys, sms).splits
            tried = [int(s) for s in args.splits.split(",") if s]
            for splits in [default] + [s for s in tried if s != default]:
                if splits > -(-keys // ma.KEY_BLOCK):
                    continue
                tuning = ma.attention_tuning(m, dims.heads, keys, sms, splits)

                def run(scs=scs, qs=qs, tuning=tuning):
                    for sc, q in zip(scs, qs):
                        ma.mega_attention(q, sc.positions, sc.key_table, sc.window_cache,
                                          sc.compressed_cache, sink, cos, sin,
                                          softmax_scale=model.softmax_scale,
                                          heads_per_group=model.heads_per_group,
                                          tuning=tuning)  # fmt: skip

                us = replay_seconds(run, args.replays) * 1e6 / len(scs)
                print(f" {fmt:10s} {m:3d} {splits:6d} {us:7.2f} {mb / us:6.2f}  ({mb:.1f})"
                      f"{'  default' if splits == default else ''}", flush=True)


if __name__ == "__main__":
    main()
