#!/usr/bin/env bash
# One device call: the layer step with the L2 prefetch plan off / on / at a smaller budget,
# both backends at tp 4 and nvidia at tp 2, then the per-kernel breakdown with it on.
# Usage: bash benchmarks/prefetch_ab.sh [tokens]   (logs under $OUT, a short table on stdout)
set -uo pipefail
tokens=${1:-1,16,48}
OUT=${OUT:-/tmp/dsv41-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch; print('L2 bytes', torch.cuda.get_device_properties(0).L2_cache_size)"
bench() {  # label, prefetch (0/1), budget MB (or ''), backends, tp
  local label=$1 pf=$2 mb=$3 backends=$4 tp=$5
  DSV41_L2_PREFETCH=$pf ${mb:+DSV41_L2_PREFETCH_MB=$mb} python3 -m dsv41.cli bench \
    --config dsv41-flash --tp "$tp" --backend "$backends" --tokens "$tokens" \
    --reference-repeats 1 --json "$OUT/ab_${label}.json" > "$OUT/ab_${label}.txt" 2>&1
  echo "== $label"; grep -E "^(nvidia|mono) " "$OUT/ab_${label}.txt" || tail -4 "$OUT/ab_${label}.txt"
}
bench tp4_off 0 "" nvidia,mono 4
bench tp4_on 1 "" nvidia,mono 4
bench tp4_on20 1 20 nvidia 4
bench tp2_off 0 "" nvidia 2
bench tp2_on 1 "" nvidia 2
DSV41_L2_PREFETCH=1 python3 benchmarks/profile_step.py --tp 4 --tokens 1 --breakdown \
  > "$OUT/breakdown_on.txt" 2>&1; tail -14 "$OUT/breakdown_on.txt"
if [ "${MONO_TP2:-1}" = 1 ]; then
  timeout 300 python3 -m pytest -q -p no:cacheprovider -x tests/gpu/test_mono_gpu.py \
    -k "every_token and tp2" --tb=short > "$OUT/mono_tp2.txt" 2>&1
  grep -E "passed|failed|Error|assert" "$OUT/mono_tp2.txt" | tail -12
fi
