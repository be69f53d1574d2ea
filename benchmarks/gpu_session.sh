#!/usr/bin/env bash
# The GPU jobs of this repository, one call on a GPU machine (H200: one call a mode fits in
# 10 minutes). Installs nothing: the machine needs torch, triton, numpy, pyyaml, safetensors
# (and ncu for `ncu`). Logs and JSON go to $OUT (default /tmp/dsv41-out).
#
#   bash benchmarks/gpu_session.sh tests [PYTEST ARGS]  tests/gpu (or the tests named)
#   bash benchmarks/gpu_session.sh parity               real geometry, tp 2 and 4, both record formats
#   bash benchmarks/gpu_session.sh tables [BACKEND]     bench tables, tp 4 and tp 2, M = 1 .. 48
#                                                       (BACKEND: nvidia (default), mono, or both
#                                                       comma-separated; both take two calls' time)
#   bash benchmarks/gpu_session.sh ab SPEC [SPEC ...]   bench tp 4, M = 1, 4, 16, 48 (AB_TOKENS), both
#                                                       backends and a row set a --variant SPEC, one
#                                                       run: nvidia:wo_a.block_k=128,wo_a.num_stages=3
#                                                       or mono:gemv_cores=0 (y vs def 0: y equal);
#                                                       AB_TOKENS=4,16,48 for MMA-loop-only fields
#   bash benchmarks/gpu_session.sh trace                where a mono step's time goes, per stage
#   bash benchmarks/gpu_session.sh stream [BACKEND [VARIANT]]
#                                                       tp 4, M = 1, 4, 16, 48: each stage's TB/s
#                                                       against cuBLAS FP8, the copy and a one-launch
#                                                       reference (benchmarks/stream.py; VARIANT:
#                                                       FIELD=VALUE[,...], the tuning changed)
#   bash benchmarks/gpu_session.sh ncu                  hardware counters at tp 4, M = 1
#
# BENCHMARKS.md holds the figures these modes gave and the command behind each table.
set -uo pipefail
what=${1:-}
[ $# -gt 0 ] && shift
OUT=${OUT:-/tmp/dsv41-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
TOKENS=1,2,4,8,16,32,48

header() {
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv,noheader \
    | tee "$OUT/gpu.txt"
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" \
    | tee -a "$OUT/gpu.txt"
}

# Every tier (-m '': the slow ones too). Arguments replace tests/gpu: the whole directory takes
# more than one 10-minute call, so run `tests tests/gpu --ignore=tests/gpu/test_mono_gpu.py`,
# then `tests tests/gpu/test_mono_gpu.py` (about 6 minutes).
tests() {
  [ $# -eq 0 ] && set -- tests/gpu
  timeout 560 python3 -m pytest -q -p no:cacheprovider -m '' --timeout 300 "$@" 2>&1 \
    | tee "$OUT/gpu_tests.log" | tail -25
}

# Both backends against the reference at the real geometry, each share and record format (mono
# reads only fp8_ds_mla records, so fp8_mx compares nvidia alone with the reference).
parity() {
  local tp fmt only
  for tp in 4 2; do
    for fmt in fp8_ds_mla fp8_mx; do
      only=; [ "$fmt" = fp8_mx ] && only="--backends nvidia"
      echo "== parity tp $tp $fmt"
      timeout 250 python3 -m dsv41.cli parity --config dsv41-flash --tp "$tp" --tokens 4 \
        --record-format "$fmt" $only --json "$OUT/parity_tp${tp}_$fmt.json" 2>&1 \
        | tee "$OUT/parity_tp${tp}_$fmt.txt" | tail -12
    done
  done
}

# One bench row a (backend, M): us a layer step replayed from a graph of the model's 40 layers,
# x floor and x eager reference (measured in the same run); rows to $OUT/tables.txt and JSON.
tables() {
  local backend=${1:-nvidia} tp
  for tp in 4 2; do
    timeout 290 python3 -m dsv41.cli bench --config dsv41-flash --backend "$backend" --tp "$tp" \
      --tokens "$TOKENS" --reference-repeats 1 --json "$OUT/bench_${backend/,/_}_tp$tp.json" 2>&1 \
      | grep -E "^(nvidia|mono|torch) |layers of|needs a CUDA" | sed "s/^/tp $tp: /" | tee -a "$OUT/tables.txt"
  done
}

# Tuning candidates against the defaults in one run (same layers, scenarios and copy bandwidth):
# each SPEC is a --variant BACKEND:FIELD=VALUE[,FIELD=VALUE...] (dsv41/bench.py).
ab() {
  [ $# -gt 0 ] || { echo "ab: expected SPECs (BACKEND:FIELD=VALUE[,...]), got none"; exit 2; }
  local spec variants=()
  for spec in "$@"; do variants+=(--variant "$spec"); done
  timeout 560 python3 -m dsv41.cli bench --config dsv41-flash --tp 4 \
    --tokens "${AB_TOKENS:-1,4,16,48}" --reference-repeats 1 --backend nvidia,mono \
    "${variants[@]}" --json "$OUT/ab.json" 2>&1 \
    | tr '\r' '\n' | grep -vE '^\[[#.]*\] ' | tee "$OUT/ab.txt"
}

stream() {
  local backend=${1:-nvidia} variant=${2:-} tag
  tag=$backend${variant:+_$(echo "$variant" | tr ',=.' '_-_')}
  timeout 500 python3 benchmarks/stream.py --backend "$backend" --tp 4 --tokens 1,4,16,48 \
    ${variant:+--variant "$variant"} --json "$OUT/stream_${tag}_tp4.json" 2>&1 \
    | tee "$OUT/stream_$tag.txt" | tail -60
}

trace() {
  timeout 200 python3 benchmarks/mono_trace.py --tp 4 --tokens 1,16,48 2>&1 | tail -36
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_mono_gpu.py -k trace \
    --timeout 140 2>&1 | tail -2
}

# Counters at tp 4, M = 1 of mono's one kernel and nvidia's four GEMMs (ncu runs the kernels one
# at a time with caches flushed, so no PDL overlap): time, launch shape, instructions, warps
# active, HBM bytes and throughput, and each stall reason of >= 0.3 cycles an issue.
ncu() {
  local NCU=${NCU:-/usr/local/cuda/bin/ncu} f
  local M="gpu__time_duration.sum,launch__registers_per_thread,launch__grid_size"
  M="$M,smsp__inst_executed.sum,dram__bytes_read.sum"
  M="$M,sm__warps_active.avg.pct_of_peak_sustained_active"
  M="$M,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
  M="$M,dram__throughput.avg.pct_of_peak_sustained_elapsed"
  M="$M,sm__throughput.avg.pct_of_peak_sustained_elapsed,smsp__cycles_active.avg"
  timeout 200 $NCU --clock-control none -k regex:mono_kernel --launch-skip 3 --launch-count 1 \
    --metrics "$M" python3 benchmarks/ncu_steps.py --backend mono > "$OUT/ncu_mono.txt" 2>&1
  timeout 200 $NCU --clock-control none -k regex:mx_gemm_kernel --launch-skip 8 --launch-count 4 \
    --metrics "$M" python3 benchmarks/ncu_steps.py --backend nvidia > "$OUT/ncu_nvidia.txt" 2>&1
  for f in mono nvidia; do
    echo "== ncu $f"
    grep -E "mono_kernel|mx_gemm_kernel|gpu__time|dram__|sm__|launch__|inst_exec" \
      "$OUT/ncu_$f.txt" | sed -E 's/ +/ /g' | head -60
    grep -E "mx_gemm_kernel|mono_kernel|issue_stalled" "$OUT/ncu_$f.txt" \
      | sed -E 's/ +/ /g;s/smsp__average_warps_issue_stalled_//' \
      | awk '/kernel/ {print substr($0, 1, 60); next} $NF+0 >= 0.3'
  done
}

case "$what" in
  tests | parity | tables | ab | stream | trace | ncu) header; "$what" "$@" ;;
  *) sed -n '2,23p' "$0"; exit 2 ;;
esac
