#!/usr/bin/env bash
# One call on the device machine: GPU tests, parity and the layer benchmark,
# logs under $OUT, a short table last. Installs nothing (the image has torch,
# triton, numpy, pyyaml, safetensors). Usage: bash benchmarks/gpu_session.sh [tests|bench|ab|trace|ncu|all]
# ab: the open A/B (mono: CUDA-core GEMV at 8 tokens, K block 1024, 32-key chunks) and mono's GPU tests.
# trace: where a mono step's time goes (benchmarks/mono_trace.py). ncu: counters at M = 1.
set -uo pipefail
what=${1:-all}
OUT=${OUT:-/tmp/dsv41-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"

if [ "$what" = tests ] || [ "$what" = all ]; then
  python3 -m pytest -q -p no:cacheprovider tests/gpu --timeout 500 ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/gpu_tests.log" | tail -25
  python3 -m dsv41.cli parity --config dsv41-flash --tp 4 --tokens 4 --json "$OUT/parity_tp4.json" 2>&1 | tee "$OUT/parity_tp4.txt"
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  for tp in 4 2; do
    python3 -m dsv41.cli bench --backend nvidia,mono --config dsv41-flash --tp "$tp" \
      --tokens 1,2,4,8,16,32,48 --json "$OUT/bench_tp${tp}.json" --plot "$OUT/bench_tp${tp}.png" \
      2>&1 | tee "$OUT/bench_tp${tp}.txt" | tail -18
  done
fi
if [ "$what" = trace ]; then
  # mono: where the step's time goes (task trace per stage), the trace's own test, GEMV K 1024.
  timeout 150 python3 benchmarks/mono_trace.py --tp 4 --tokens 1,16,48 2>&1 | tail -36
  timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_mono_gpu.py -k trace 2>&1 | tail -2
  DSV41_MONO_GEMV_BLOCK=1024 timeout 120 python3 -m dsv41.cli bench --backend mono --config dsv41-flash \
    --tp 4 --tokens 1,16 --reference-repeats 1 2>&1 | grep -E "^mono " | sed 's/^/GEMV K 1024: /'
fi
if [ "$what" = ncu ]; then
  # Hardware counters at tp 4, M = 1: mono's one kernel, then nvidia's four GEMMs of one step.
  NCU=/usr/local/cuda/bin/ncu
  M="gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum"
  M="$M,sm__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active"
  M="$M,smsp__cycles_active.avg,sm__cycles_elapsed.avg.per_second,launch__registers_per_thread"
  M="$M,launch__grid_size,smsp__inst_executed.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum"
  M="$M,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
  timeout 130 $NCU --clock-control none -k regex:mono_kernel --launch-skip 3 --launch-count 1 \
    --metrics "$M" python3 benchmarks/ncu_steps.py --backend mono > "$OUT/ncu_mono.txt" 2>&1
  timeout 110 $NCU --clock-control none -k regex:mx_gemm_kernel --launch-skip 8 --launch-count 4 \
    --metrics "$M" python3 benchmarks/ncu_steps.py --backend nvidia > "$OUT/ncu_nvidia.txt" 2>&1
  for f in mono nvidia; do
    echo "== ncu $f"
    grep -E "mono_kernel|mx_gemm_kernel|gpu__time|dram__|sm__|launch__|inst_exec|bank_conf" "$OUT/ncu_$f.txt" \
      | sed -E 's/ +/ /g' | head -60
    grep -E "mx_gemm_kernel|mono_kernel|issue_stalled" "$OUT/ncu_$f.txt" | sed -E 's/ +/ /g;s/smsp__average_warps_issue_stalled_//' \
      | awk '/kernel/ {print substr($0, 1, 60); next} $NF+0 >= 0.3' 
  done
fi
if [ "$what" = ab ]; then
  # Session 5's A/B: mono's CUDA-core GEMV (default up to 4 tokens) at 8 tokens, its K block
  # 1024, 32-key attention chunks; the stage trace at M = 1; the mono GPU tests.
  b() { timeout 150 python3 -m dsv41.cli bench --backend mono --config dsv41-flash --tp 4 \
    --reference-repeats 1 "$@" 2>&1 | grep -E "^mono "; }
  b --tokens 1,2,4,8,16 | sed "s/^/default: /"
  DSV41_MONO_GEMV_CORES=8 b --tokens 8 | sed "s/^/cores <= 8: /"
  DSV41_MONO_GEMV_BLOCK=1024 b --tokens 1 | sed "s/^/K block 1024: /"
  DSV41_MONO_KEY_CHUNK=32 b --tokens 1,4 | sed "s/^/key chunk 32: /"
  timeout 120 python3 benchmarks/mono_trace.py --tp 4 --tokens 1 2>&1 | tail -11
  python3 -m pytest -q -p no:cacheprovider tests/gpu/test_mono_gpu.py --timeout 500 2>&1 | tail -4
fi
