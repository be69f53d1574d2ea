#!/usr/bin/env bash
# One call on the device machine: GPU tests, parity and the layer benchmark,
# logs under $OUT, a short table last. Installs nothing (the image has torch,
# triton, numpy, pyyaml, safetensors). Usage: bash benchmarks/gpu_session.sh [tests|bench|ab|all]
# ab: the open A/Bs (mono: per-task L2 prefetch, GEMV K block 256 / 512; nvidia attention splits).
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
  # mono: per-task L2 prefetch of the weight slice (off / on) x GEMV K block (256 / 512).
  for pf in 0 1; do
    for gb in 256 512; do
      DSV41_MONO_L2_PREFETCH=$pf DSV41_MONO_GEMV_BLOCK=$gb python3 -m dsv41.cli bench --backend mono \
        --config dsv41-flash --tp 4 --tokens 1,16,48 --reference-repeats 1 \
        --json "$OUT/ab_pf${pf}_gb$gb.json" > "$OUT/ab_pf${pf}_gb$gb.txt" 2>&1
      echo "== mono, L2 prefetch $pf, GEMV block $gb"; grep -E "^mono " "$OUT/ab_pf${pf}_gb$gb.txt" || tail -3 "$OUT/ab_pf${pf}_gb$gb.txt"
    done
  done
  DSV41_MONO_L2_PREFETCH=1 python3 -m dsv41.cli parity --config dsv41-flash --tp 4 --tokens 4 2>&1 | tail -2
  # nvidia attention: key-table splits at 1, 8 and 48 tokens.
  python3 benchmarks/profile_step.py --tp 4 --tokens 1,8,48 --attn-sweep 2>&1 | grep -E "attention|splits"
fi
