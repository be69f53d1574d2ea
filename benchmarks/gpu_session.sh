#!/usr/bin/env bash
# One call on the device machine: GPU tests, parity and the layer benchmark,
# logs under $OUT, a short table last. Installs nothing (the image has torch,
# triton, numpy, pyyaml, safetensors). Usage: bash benchmarks/gpu_session.sh [tests|bench|ab|all]
# ab: the open A/Bs (nvidia: side-stream L2 prefetch; mono: whole-layer L2 prefetch x GEMV K block
# 256 / 512), then the nvidia GPU tests.
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
  # nvidia: the side-stream L2 prefetch of the step's weights, off / on.
  for pf in 0 1; do
    DSV41_L2_PREFETCH=$pf python3 -m dsv41.cli bench --backend nvidia --config dsv41-flash --tp 4 \
      --tokens 1,2,8,16,48 --reference-repeats 1 --json "$OUT/ab_nv_pf$pf.json" > "$OUT/ab_nv_pf$pf.txt" 2>&1
    echo "== nvidia, L2 prefetch $pf"; grep -E "^nvidia " "$OUT/ab_nv_pf$pf.txt" || tail -3 "$OUT/ab_nv_pf$pf.txt"
  done
  python3 benchmarks/profile_step.py --tp 4 --tokens 1 --breakdown 2>&1 | tail -14
  # mono: each program's share of the whole layer asked of the L2 at the start, x GEMV block.
  for pf in 0 1; do
    for gb in 256 512; do
      DSV41_MONO_L2_PREFETCH=$pf DSV41_MONO_GEMV_BLOCK=$gb python3 -m dsv41.cli bench --backend mono \
        --config dsv41-flash --tp 4 --tokens 1,16,48 --reference-repeats 1 \
        --json "$OUT/ab_pf${pf}_gb$gb.json" > "$OUT/ab_pf${pf}_gb$gb.txt" 2>&1
      echo "== mono, L2 prefetch $pf, GEMV block $gb"; grep -E "^mono " "$OUT/ab_pf${pf}_gb$gb.txt" || tail -3 "$OUT/ab_pf${pf}_gb$gb.txt"
    done
  done
  DSV41_MONO_L2_PREFETCH=1 python3 -m dsv41.cli parity --config dsv41-flash --tp 4 --tokens 4 2>&1 | tail -2
  python3 -m pytest -q -p no:cacheprovider tests/gpu/test_nvidia_step_gpu.py --timeout 500 2>&1 | tail -4
fi
