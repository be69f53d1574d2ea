#!/usr/bin/env bash
# One call on the device machine: GPU tests, parity and the layer benchmark,
# logs under $OUT, a short table last. Installs nothing (the image has torch,
# triton, numpy, pyyaml, safetensors). Usage: bash benchmarks/gpu_session.sh [tests|bench|ab|all]
# ab: the open A/Bs (nvidia GEMMs: CUDA-core loop up to which bucket, PDL; tile sweep).
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
if [ "$what" = ab ]; then
  # nvidia GEMMs: the CUDA-core loop up to bucket 0 (off) / 8 / 16, with and without PDL.
  python3 benchmarks/profile_step.py --tp 4 --tokens 1,8 --sweep > "$OUT/sweep.txt" 2>&1
  grep -E "^(wqkv|wq_b|wo_a|wo_b) M=|MMA loop|^ +[0-9.]+ us" "$OUT/sweep.txt" | head -60
  python3 benchmarks/profile_step.py --tp 4 --tokens 1,8 --breakdown > "$OUT/breakdown.txt" 2>&1
  tail -20 "$OUT/breakdown.txt"
  for pdl in 0 1; do
    for gm in 0 8 16; do
      DSV41_PDL=$pdl DSV41_GEMV_MAX_M=$gm python3 -m dsv41.cli bench --backend nvidia \
        --config dsv41-flash --tp 4 --tokens 1,2,4,8,16 --reference-repeats 1 \
        --json "$OUT/ab_pdl${pdl}_gemv$gm.json" > "$OUT/ab_pdl${pdl}_gemv$gm.txt" 2>&1
      echo "== nvidia, PDL $pdl, GEMV up to M = $gm"; grep -E "^nvidia " "$OUT/ab_pdl${pdl}_gemv$gm.txt" || tail -3 "$OUT/ab_pdl${pdl}_gemv$gm.txt"
    done
  done
fi
