#!/usr/bin/env bash
# One call on the device machine: GPU tests, parity and the layer benchmark,
# logs under $OUT, a short table last. Installs nothing (the image has torch,
# triton, numpy, pyyaml, safetensors). Usage: bash benchmarks/gpu_session.sh MODE, MODE one of
# tests bench ab steps pdl sweep s6 s6b s6c s6tests next next-tests s7 s7-final s8 s8-tests
# s8b s8c s8d s8e s8f s8g s9 s9b s9c s9-tests s9d s10 s10b s10c s10d s10e
# s10f s10g s11 s11b s11c s11d s11e s11f s11g s11h s12 s12b s12c s12d s12e s12f
# s12g s13 s13b s13c s13d s13e s14 s14b s14c s15 s15b s16 s16b s16c s16d s16e s17 s17b s17c s17d s17e s18 s18b s18c s18d s18e s19 s19b s19c s19d s19e s20 s20b s20c s20d s20e s20f s21 s21b s21c s21d s21e s22 s22b s22c s22d s22e s22f s22g s23 s23b s23c s23d s23e s24 s24b s24c s24d s25 s25b s25c s26 s26b trace ncu all (default all).
# ab: session 5's A/B (each switch off) with the tables; steps: both step tests; pdl, sweep,
# s6, s6b, s6tests, s6c: session 6's calls; next, next-tests: prepared for session 7;
# s7: session 7's call 3 (the L2 prefetch A/B; the prefetch was removed after it);
# s7-final: session 7's last call; s8, s8-tests: prepared for session 8; s8b .. s8g: session 8's
# calls 2 to 7; s9: prepared for session 9; s9b, s9c, s9-tests, s9d: session 9's calls 2 to 5;
# s10 .. s10g: session 10's calls 1 to 7; s11 .. s11e, s11g, s11h: session 11's calls 1 to 7 (s11f
# prepared, not run); s12 .. s12g: session 12's calls; s13 .. s13e: session 13's;
# s14 .. s14c: session 14's;
# s15, s15b: session 15's; s16 .. s16e: session 16's (s16, s16b: the tensor-core GEMV, removed
# after them; DSV41_GEMV_TC no longer exists); s17 .. s17e: session 17's; s18: prepared for
# session 18 (run in its call 1; the late release was removed after it); s18b .. s18e: session
# 18, calls 2 to 5 (the attention insert of s18b .. s18d, DSV41_ATTN_INSERT, removed after them).
# s19, s19b: session 19's calls 1 and 2 (the flag hand-offs, DSV41_HANDOFF, removed after them);
# s19c: call 3 (per-site 64 KB tiles and bf16 attention partials, removed after it); s19d:
# calls 4 and 5 (call 4's tree did not compile the prefetch; wo_a's prefetch of wo_b's weights,
# removed after them); s19e: call 7 (wo_a on e4m3 mma.sync, DSV41_GEMV_MMA, removed after it;
# call 6 ran mma_probe.py). s20: session 20's call 1 (one token's block sums on f16 tensor
# cores, DSV41_GEMV_TC: a new switch of that name, not session 16's; removed after it); s20b:
# call 2 (the combine and wo_a in one launch, DSV41_FUSE_WO_A; removed after it); s20c: call 3
# (each kernel's hardware counters at tp 4, M = 1); s20d: call 4 (the combine's split pieces);
# s20e: call 5 (every nvidia GPU test; the combine's heads a program); s20f: call 6 (attention's
# warps, DSV41_ATTN_WARPS; removed after it). s21: session 21's call 1 (attention and the combine
# alone on their SMs, DSV41_ATTN_PER_SM / DSV41_COMBINE_PER_SM); s21b: call 2 (attention alone,
# 1 or 2 a SM, one and two tokens; both switches were replaced after it by DSV41_ATTN_ALONE, one
# program a SM, code in 584bfd2); s21c: call 3 (attention alone by default at tp 4, M = 1:
# the tests, its warps, score segments and the combine's heads beside it); s21d: call 4 (an
# early split's keys made after the wait where attention is alone, DSV41_ATTN_KEYS_AFTER_WAIT;
# removed after it, code in 276e859; the tables); s21e: call 5 (the trace, with the attention
# programs that end last). s22: session 22's call 1 (the score dot's keys shaped before the wait
# against the tree before it in _old/, the combine split by split, attention alone at tp 2, M = 2;
# the trace); s22b: call 2 (attention's loop spread with PDL off and not alone; alone at tp 2);
# s22c: call 3 (the combine's release of wo_a delayed, DSV41_COMBINE_RELEASE_NS; removed after
# it, code in 7ea6aca); s22d: call 4 (every nvidia GPU test, attention alone
# for two-block splits, the tables); s22e: call 5 (after the keys-before-wait change was
# reverted: alone against not at tp 2, one and two tokens; the tables); s22f: call 6 (attention
# launched twice with PDL off, DSV41_ATTN_TWICE: its second launch's trace; removed after it,
# code in bd4e60b); s22g: call 7 (q read straight into the score dot's segments, DSV41_ATTN_Q3D;
# removed after it, code in 5d98b97). s23: session 23's call 1 (the trace's cycle counts;
# one-token GEMV warps 8 / 4 / 2);
# s23b: call 2 (one-token GEMV programs of 16 warps); s23c: call 3 (inputs' lines asked of the
# L2 before the PDL wait, DSV41_TOUCH); s23d: call 4 (q and the key table read again, traced);
# s23e: call 5 (activations written to copies, DSV41_COPIES); s24: session 24's call 1 (q read
# in its memory order, DSV41_ATTN_Q_LINES; the only read after it); s24b: call 2 (mono's q read
# in memory order against the tree before it, the tests, nvidia's tables); s24c: call 3 (the
# q-tile test on the GPU, the score dot's segments with q read in memory order); s24d: call 4
# (the final tree's nvidia step tests and mono's tp 2 tests, one tp 4, M = 1 bench); s25:
# session 25's call 1 (mono's tp 2 test of every M with each q read, DSV41_MONO_Q_LINES; the
# memory-order read mono's only one after it); s25b: call 2 (a step's time against the graph's
# layer count; mono's GPU tests not yet run with that read; call 3 ran its nvidia loop inline,
# with 40, 4, 40, 40 layers); s25c: every mono GPU test (run as session 26's call 3). s26:
# session 26's call 1 (nvidia's tables in graphs of the model's 40 layers); s26b: mono's tables
# likewise (not run as a mode: call 2 ran them inline).
# trace: where a mono step's time goes (benchmarks/mono_trace.py). ncu: counters at M = 1.
set -uo pipefail
what=${1:-all}
OUT=${OUT:-/tmp/dsv41-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv,noheader \
  | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" \
  | tee -a "$OUT/gpu.txt"
# ncu, and the counters both of its modes (ncu, s20c) read: time, launch shape, instructions,
# warps active, HBM bytes, and each stall reason's cycles an issued instruction.
NCU=/usr/local/cuda/bin/ncu
NCU_METRICS="gpu__time_duration.sum,launch__registers_per_thread,launch__grid_size"
NCU_METRICS="$NCU_METRICS,smsp__inst_executed.sum,dram__bytes_read.sum"
NCU_METRICS="$NCU_METRICS,sm__warps_active.avg.pct_of_peak_sustained_active"
NCU_METRICS="$NCU_METRICS,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
# One bench run's table rows (the eager reference timed once); the modes below call it.
b() { timeout ${BT:-200} python3 -m dsv41.cli bench --config dsv41-flash --reference-repeats 1 "$@" \
  2>&1 | grep -E "^(nvidia|mono) "; }
# v "VAR=V VAR2=V2" ARGS: b ARGS with those switches set, rows tagged with them.
v() {
  local sets=$1
  shift
  (if [ -n "$sets" ]; then export $sets; fi; b "$@") | sed "s|^|${sets:-default} $*: |"
}
# ab VAR "V1 V2 ..." ARGS: b ARGS once for each value of the switch VAR, rows tagged with both.
ab() {
  local var=$1 vals=$2 val
  shift 2
  for val in $vals; do v "$var=$val" "$@"; done
}

# vs_old TREE ARGS: b ARGS on this tree (rows tagged "default ARGS") and on the copy of TREE in
# _old/ (not committed; rows tagged "TREE"), one after the other in the same call.
vs_old() {
  local tree=$1
  shift
  v "" "$@"
  (cd _old && export PYTHONPATH=$PWD && b "$@" | sed "s/^/$tree: /")
}
# one_two_vs_old TREE: nvidia at one and two tokens against TREE, twice at tp 4, once at tp 2.
one_two_vs_old() {
  for r in 1 2; do vs_old "$1" --backend nvidia --tp 4 --tokens 1,2; done
  vs_old "$1" --backend nvidia --tp 2 --tokens 1,2
}

# switch_call VAR ON "TP4 VALUES" ["TP2 VALUES"]: nvidia's step tests with VAR=ON; A/B of the
# values twice at tp 4 and once at tp 2 (TP2 VALUES, else the same), one token; the attention
# trace with VAR=ON.
switch_call() {
  local var=$1 on=$2 tp4=$3 tp2=${4:-$3}
  env "$var=$on" timeout 150 python3 -m pytest -q -p no:cacheprovider \
    tests/gpu/test_nvidia_step_gpu.py -k "step_matches or graph" --timeout 140 2>&1 | tail -3
  for r in 1 2; do ab "$var" "$tp4" --backend nvidia --tp 4 --tokens 1; done
  ab "$var" "$tp2" --backend nvidia --tp 2 --tokens 1
  env "$var=$on" timeout 100 python3 benchmarks/profile_step.py --tp 4 --tokens 1 \
    --attn-trace 2>&1 | tail -10
}

# trace_and_tests VAR=V FLAG LINES: with the switch set, the one-token trace at tp 4 (profile_step
# FLAG, its last LINES lines), then the step tests.
trace_and_tests() {
  env "$1" timeout 100 python3 benchmarks/profile_step.py --tp 4 --tokens 1 "$2" 2>&1 \
    | tail -"$3"
  env "$1" timeout 150 python3 -m pytest -q -p no:cacheprovider \
    tests/gpu/test_nvidia_step_gpu.py -k "step_matches or graph" --timeout 140 2>&1 | tail -3
}

# tables BACKENDS [tee]: every M at tp 4 then tp 2, rows tagged "tp T: "; with "tee" (BT s, 200
# by default, a run; rows appended to $OUT/tables.txt) else each share's rows in $OUT/bench_tpT.json.
tables() {
  local tp
  for tp in 4 2; do
    if [ "${2:-}" = tee ]; then
      BT=${BT:-200} b --backend "$1" --tp "$tp" --tokens 1,2,4,8,16,32,48 | sed "s/^/tp $tp: /" \
        | tee -a "$OUT/tables.txt"
    else
      b --backend "$1" --tp $tp --tokens 1,2,4,8,16,32,48 --json "$OUT/bench_tp$tp.json" \
        | sed "s/^/tp $tp: /"
    fi
  done
}

if [ "$what" = tests ] || [ "$what" = all ]; then
  python3 -m pytest -q -p no:cacheprovider tests/gpu --timeout 500 ${PYTEST_ARGS:-} 2>&1 \
    | tee "$OUT/gpu_tests.log" | tail -25
  python3 -m dsv41.cli parity --config dsv41-flash --tp 4 --tokens 4 --json "$OUT/parity_tp4.json" \
    2>&1 | tee "$OUT/parity_tp4.txt"
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  for tp in 4 2; do
    python3 -m dsv41.cli bench --backend nvidia,mono --config dsv41-flash --tp "$tp" \
      --tokens 1,2,4,8,16,32,48 --json "$OUT/bench_tp${tp}.json" --plot "$OUT/bench_tp${tp}.png" \
      2>&1 | tee "$OUT/bench_tp${tp}.txt" | tail -18
  done
fi
if [ "$what" = s13 ]; then
  # Session 13, call 1 (about 8 minutes): one token's whole GEMV rows past 2048 columns as a
  # power-of-two tile and a tail, both loaded before the PDL wait (DSV41_GEMV_TAIL=bytes of the
  # tile: Wqkv 4096 + 1024 and wq_b 1024 + 256 columns, no split-K sum), and z cast to MXFP8 in
  # wo_b's prologue (DSV41_Z_CAST_IN_WOB=1: wo_a without its 32-row MXFP8 epilogue, so whole rows
  # at one token). nvidia's step tests with both; A/B at one and two tokens; timelines.
  DSV41_GEMV_TAIL=32768 DSV41_Z_CAST_IN_WOB=1 timeout 150 python3 -m pytest -q \
    -p no:cacheprovider tests/gpu/test_nvidia_step_gpu.py --timeout 140 2>&1 | tail -3
  T16="DSV41_GEMV_TAIL=16384" T32="DSV41_GEMV_TAIL=32768" Z="DSV41_Z_CAST_IN_WOB=1"
  for sets in "" "$T16" "$T32" "$Z" "$T16 $Z" "$T32 $Z" ""; do
    v "$sets" --backend nvidia --tp 4 --tokens 1,2
  done
  for sets in "" "$T16 $Z" "$T32 $Z" "$Z"; do v "$sets" --backend nvidia --tp 2 --tokens 1,2; done
  for sets in "$T16 $Z" "$T32 $Z"; do
    (export $sets; timeout 100 python3 benchmarks/profile_step.py --tp 4 --tokens 1 --timeline \
      2>&1 | tail -9 | sed "s|^|$sets: |")
  done
fi
if [ "$what" = s13b ]; then
  # Session 13, call 2 (about 7 minutes): the new one-token defaults (whole rows with a tail in
  # 32 KB tiles, z cast in wo_b): nvidia's GPU tests; A/B against both off, and with the norm
  # kernel's side stream at high priority (DSV41_SIDE_PRIORITY=1), twice at tp 4; the timeline.
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_nvidia_step_gpu.py \
    tests/gpu/test_mega_attention_gpu.py --timeout 190 2>&1 | tail -3
  OFF="DSV41_GEMV_TAIL=0 DSV41_Z_CAST_IN_WOB=0" P="DSV41_SIDE_PRIORITY=1"
  for r in 1 2; do
    for sets in "" "$OFF" "$P"; do v "$sets" --backend nvidia --tp 4 --tokens 1,2; done
  done
  for sets in "" "$OFF" "$P"; do v "$sets" --backend nvidia --tp 2 --tokens 1; done
  (export $P; timeout 100 python3 benchmarks/profile_step.py --tp 4 --tokens 1 --timeline \
    2>&1 | tail -8 | sed "s|^|$P: |")
fi
if [ "$what" = s13c ]; then
  # Session 13, call 3 (about 5 minutes): each GEMM program's start, PDL wait end and end in the
  # bench graph (profile_step.py --gemv-trace) and its test; nvidia's tables at both shares.
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_nvidia_step_gpu.py \
    -k trace --timeout 140 2>&1 | tail -2
  timeout 120 python3 benchmarks/profile_step.py --tp 4 --tokens 1,2 --gemv-trace 2>&1 | tail -16
  timeout 100 python3 benchmarks/profile_step.py --tp 2 --tokens 1 --gemv-trace 2>&1 | tail -7
  tables nvidia
fi
if [ "$what" = s13d ]; then
  # Session 13, call 4 (about 7 minutes): the norm kernel's kv half only beside wq_b, the MX
  # round without its e4m3 round trip, wq_b's norm weight and the combine's sinks read before
  # their PDL waits: nvidia's GPU tests; A/B against call 3's tree (a copy of its dsv41/ and
  # configs/ in _old/, a directory of this call only), twice at tp 4; the GEMM trace and the
  # timeline.
  timeout 220 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_nvidia_step_gpu.py \
    tests/gpu/test_mega_attention_gpu.py --timeout 200 2>&1 | tail -3
  for r in 1 2; do vs_old "call 3 tree" --backend nvidia --tp 4 --tokens 1,2; done
  vs_old "call 3 tree" --backend nvidia --tp 2 --tokens 1
  timeout 100 python3 benchmarks/profile_step.py --tp 4 --tokens 1 --gemv-trace 2>&1 | tail -6
  timeout 100 python3 benchmarks/profile_step.py --tp 4 --tokens 1 --timeline 2>&1 | tail -8
fi
if [ "$what" = s13e ]; then
  # Session 13, call 5 (about 5 minutes): the final tree's tables, nvidia and mono, both shares;
  # wo_b at one token in 16-row tiles (DSV41_GEMV_TILE=32768) against 8, twice.
  for r in 1 2; do
    for sets in "" "DSV41_GEMV_TILE=32768"; do v "$sets" --backend nvidia --tp 4 --tokens 1; done
  done
  tables nvidia,mono
fi
if [ "$what" = s14 ]; then
  # Session 14, call 1 (about 7 minutes): nvidia's step tests with wo_b's one-token 16-row tile
  # (the new default) and the attention trace's test; tp 4 and tp 2 at 1 and 2 tokens, twice;
  # the GEMM + attention trace at tp 4, M = 1 and 8, and tp 2, M = 1; the timeline.
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_nvidia_step_gpu.py \
    --timeout 190 2>&1 | tail -3
  for r in 1 2; do
    for tp in 4 2; do v "" --backend nvidia --tp $tp --tokens 1,2; done
  done
  timeout 100 python3 benchmarks/profile_step.py --tp 4 --tokens 1,8 --attn-trace 2>&1 | tail -22
  timeout 100 python3 benchmarks/profile_step.py --tp 2 --tokens 1 --attn-trace 2>&1 | tail -9
  timeout 100 python3 benchmarks/profile_step.py --tp 4 --tokens 1 --timeline 2>&1 | tail -9
fi
if [ "$what" = s14b ]; then
  # Session 14, call 2 (about 8 minutes): attention's and the combine's RoPE angles before the
  # PDL wait, and the one-token GEMV cast rounding with the hardware (scales after the block
  # sums): the MX GPU test, nvidia's GPU tests; A/B against call 1's tree (5ef6263, a copy in
  # _old/, not committed) at tp 4 and 2; the GEMM + attention trace; the timeline.
  timeout 280 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_mx_gpu.py \
    tests/gpu/test_nvidia_step_gpu.py tests/gpu/test_mega_attention_gpu.py --timeout 270 2>&1 \
    | tail -3
  one_two_vs_old 5ef6263
  timeout 100 python3 benchmarks/profile_step.py --tp 4 --tokens 1 --attn-trace 2>&1 | tail -9
  timeout 100 python3 benchmarks/profile_step.py --tp 4 --tokens 1 --timeline 2>&1 | tail -9
fi
if [ "$what" = s14c ]; then
  # Session 14, call 3: the norm kernel's record prefetch (DSV41_NORM_PREFETCH=1, opt-in): the
  # step tests with it, then A/B at tp 4 and 2, one and two tokens.
  DSV41_NORM_PREFETCH=1 timeout 200 python3 -m pytest -q -p no:cacheprovider \
    tests/gpu/test_nvidia_step_gpu.py -k "step_matches or graph" --timeout 190 2>&1 | tail -3
  for r in 1 2; do ab DSV41_NORM_PREFETCH "0 1" --backend nvidia --tp 4 --tokens 1,2; done
  ab DSV41_NORM_PREFETCH "0 1" --backend nvidia --tp 2 --tokens 1
fi
if [ "$what" = s15 ]; then
  # Session 15, call 1 (about 8 minutes): the one-token GEMV reads every activation piece (and
  # wq_b's RMS factor from them) right after its wait; GPU bf16 rounds by the hardware cast.
  # nvidia's GPU tests; A/B against the session's starting tree (6620dcd, a copy in _old/, not
  # committed) at tp 4 and 2; the GEMM + attention trace with wo_a's SMs.
  timeout 280 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_mx_gpu.py \
    tests/gpu/test_nvidia_step_gpu.py tests/gpu/test_mega_attention_gpu.py --timeout 270 2>&1 \
    | tail -3
  one_two_vs_old 6620dcd
  timeout 100 python3 benchmarks/profile_step.py --tp 4 --tokens 1 --attn-trace 2>&1 | tail -10
fi
if [ "$what" = s15b ]; then
  # Session 15, call 2 (about 8 minutes): one-block attention splits without the softmax
  # rescale, the o epilogue's bf16 round by the GPU's cast; nvidia's step and attention GPU
  # tests, then the tables of both backends at tp 4 and 2.
  timeout 250 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_nvidia_step_gpu.py \
    tests/gpu/test_mega_attention_gpu.py --timeout 240 2>&1 | tail -3
  tables nvidia,mono tee
fi
if [ "$what" = s16 ]; then
  # Session 16, call 1 (about 5 minutes): one token's whole-row GEMV tiles run their dot on
  # tensor cores (DSV41_GEMV_TC=1 then: every site), nvidia's GPU tests with it; A/B against the
  # CUDA-core dot at tp 4 (twice) and tp 2, one and two tokens; the GEMM + attention trace.
  timeout 250 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_mx_gpu.py \
    tests/gpu/test_nvidia_step_gpu.py tests/gpu/test_mega_attention_gpu.py --timeout 240 2>&1 \
    | tail -3
  for r in 1 2; do ab DSV41_GEMV_TC "1 0" --backend nvidia --tp 4 --tokens 1,2; done
  ab DSV41_GEMV_TC "1 0" --backend nvidia --tp 2 --tokens 1,2
  for tc in 1 0; do
    (export DSV41_GEMV_TC=$tc; timeout 60 python3 benchmarks/profile_step.py --tp 4 --tokens 1 \
      --attn-trace 2>&1 | tail -10 | sed "s/^/TC=$tc: /")
  done
fi
if [ "$what" = s16b ]; then
  # Session 16, call 2 (about 5 minutes): tensor cores only where the programs fit two a SM
  # (tp 4: wo_a), segments of 16 blocks: nvidia's GEMM and step GPU tests; A/B against the
  # CUDA-core dot and with 4-warp tensor-core programs, tp 4 (twice), one and two tokens.
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_mx_gpu.py \
    tests/gpu/test_nvidia_step_gpu.py --timeout 190 2>&1 | tail -3
  for r in 1 2; do
    for sets in "" "DSV41_GEMV_TC=0" "DSV41_GEMV_TC_WARPS=4"; do
      v "$sets" --backend nvidia --tp 4 --tokens 1,2
    done
  done
  timeout 60 python3 benchmarks/profile_step.py --tp 4 --tokens 1 --attn-trace 2>&1 | tail -10
fi
if [ "$what" = s16c ]; then
  # Session 16, call 3 (about 6 minutes): nvidia's step GPU tests on the final defaults
  # (tensor cores off), then the tables of both backends at tp 4 and 2.
  timeout 160 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_nvidia_step_gpu.py \
    --timeout 150 2>&1 | tail -3
  tables nvidia,mono tee
fi
if [ "$what" = s16d ]; then
  # Session 16, call 4 (about 6 minutes): attention's early key block converted to the dot's
  # bf16 before the PDL wait (SM90 SASS after the wait, Triton 3.6: 1175 -> 919 lines at tp 4,
  # M = 1): nvidia's step and attention GPU tests; A/B against 0aa86cd (a copy in _old/, not
  # committed) at tp 4 (twice) and tp 2, one and two tokens.
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_nvidia_step_gpu.py \
    tests/gpu/test_mega_attention_gpu.py -k "step_matches or graph or matches_reference" \
    --timeout 190 2>&1 | tail -3
  one_two_vs_old 0aa86cd
fi
if [ "$what" = s16e ]; then
  # Session 16, call 5 (about 4 minutes): one token's weight scales converted before the PDL
  # wait (gemv_early_scales, removed after this call): nvidia's GEMM and step GPU tests; A/B
  # against 542c57d (a copy in _old/, not committed) at tp 4 (twice) and tp 2, one and two
  # tokens.
  timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_mx_gpu.py \
    tests/gpu/test_nvidia_step_gpu.py -k "not o_proj and not trace and not graph" \
    --timeout 110 2>&1 | tail -3
  one_two_vs_old 542c57d
fi
if [ "$what" = trace ]; then
  # mono: where the step's time goes (task trace per stage), the trace's own test, GEMV K 1024.
  timeout 150 python3 benchmarks/mono_trace.py --tp 4 --tokens 1,16,48 2>&1 | tail -36
  timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_mono_gpu.py -k trace 2>&1 \
    | tail -2
  DSV41_MONO_GEMV_BLOCK=1024 b --backend mono --tp 4 --tokens 1,16 | sed 's/^/GEMV K 1024: /'
fi
if [ "$what" = ncu ]; then
  # Hardware counters at tp 4, M = 1: mono's one kernel, then nvidia's four GEMMs of one step.
  M="$NCU_METRICS,dram__throughput.avg.pct_of_peak_sustained_elapsed"
  M="$M,sm__throughput.avg.pct_of_peak_sustained_elapsed,smsp__cycles_active.avg"
  M="$M,sm__cycles_elapsed.avg.per_second,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum"
  timeout 130 $NCU --clock-control none -k regex:mono_kernel --launch-skip 3 --launch-count 1 \
    --metrics "$M" python3 benchmarks/ncu_steps.py --backend mono > "$OUT/ncu_mono.txt" 2>&1
  timeout 110 $NCU --clock-control none -k regex:mx_gemm_kernel --launch-skip 8 --launch-count 4 \
    --metrics "$M" python3 benchmarks/ncu_steps.py --backend nvidia > "$OUT/ncu_nvidia.txt" 2>&1
  for f in mono nvidia; do
    echo "== ncu $f"
    grep -E "mono_kernel|mx_gemm_kernel|gpu__time|dram__|sm__|launch__|inst_exec|bank_conf" \
      "$OUT/ncu_$f.txt" \
      | sed -E 's/ +/ /g' | head -60
    grep -E "mx_gemm_kernel|mono_kernel|issue_stalled" "$OUT/ncu_$f.txt" \
      | sed -E 's/ +/ /g;s/smsp__average_warps_issue_stalled_//' \
      | awk '/kernel/ {print substr($0, 1, 60); next} $NF+0 >= 0.3' 
  done
fi
if [ "$what" = ab ]; then
  # Session 5's A/B, each switch off against the defaults, and the tables for BENCHMARKS.md:
  # nvidia's wq_b RMSNorm prologue, PDL; mono's wo_a K parts. (Call 3 also ran the register
  # cap of d018cec, since reverted, with DSV41_GEMV_ONE_WAVE=0.)
  b --backend nvidia,mono --tp 4 --tokens 1,2,4,8,16,32,48 --json "$OUT/bench_tp4.json" \
    | sed "s/^/tp 4: /"
  b --backend nvidia,mono --tp 2 --tokens 1,16,48 --json "$OUT/bench_tp2.json" | sed "s/^/tp 2: /"
  DSV41_NORM_IN_WQB=0 b --backend nvidia --tp 4 --tokens 1 | sed "s/^/norm in wq_b off: /"
  DSV41_PDL=1 b --backend nvidia --tp 4 --tokens 1,16 | sed "s/^/PDL on: /"
  DSV41_MONO_WOA_PARTS=1 b --backend mono --tp 4 --tokens 1,16,48 | sed "s/^/woa parts 1: /"
  timeout 120 python3 benchmarks/mono_trace.py --tp 4 --tokens 1 2>&1 | tail -11
fi
if [ "$what" = s6 ]; then
  # Session 6: the nvidia step tests with PDL on at M = 1 and whole-row GEMV tiles (the
  # defaults now), the tables at both shares, mono with 16 warps a program, and its trace.
  python3 -m pytest -q -p no:cacheprovider tests/gpu/test_nvidia_step_gpu.py --timeout 300 \
    2>&1 | tail -3
  b --backend nvidia,mono --tp 4 --tokens 1,2,4,8,16,32,48 --json "$OUT/bench_tp4.json" \
    | sed "s/^/tp 4: /"
  b --backend nvidia,mono --tp 2 --tokens 1,16,48 --json "$OUT/bench_tp2.json" | sed "s/^/tp 2: /"
  DSV41_MONO_WARPS=16 b --backend mono --tp 4 --tokens 1,4,16,48 | sed "s/^/mono 16 warps: /"
  DSV41_MONO_WARPS=16 timeout 120 python3 benchmarks/mono_trace.py --tp 4 --tokens 1 2>&1 \
    | tail -11 | sed "s/^/16 warps: /"
fi
if [ "$what" = s6b ]; then
  # Session 6, call 4: nvidia at M = 1, whole-row GEMV tiles of at most 1 or 5 K steps, PDL
  # on (the default at M = 1) and off; mono's tables with 16 single-MX-block combine tasks.
  for st in 1 5; do
    for pdl in 1 0; do
      DSV41_GEMV_STEPS=$st DSV41_PDL=$pdl b --backend nvidia --tp 4 --tokens 1 \
        | sed "s/^/steps $st, PDL $pdl, tp 4: /"
    done
    DSV41_GEMV_STEPS=$st b --backend nvidia --tp 2 --tokens 1 | sed "s/^/steps $st, PDL 1, tp 2: /"
  done
  b --backend mono --tp 4 --tokens 1,2,4,8,16,32,48 --json "$OUT/bench_mono_tp4.json" \
    | sed "s/^/tp 4: /"
  b --backend mono --tp 2 --tokens 1,16,48 --json "$OUT/bench_mono_tp2.json" | sed "s/^/tp 2: /"
  timeout 120 python3 benchmarks/mono_trace.py --tp 4 --tokens 1 2>&1 | tail -11
fi
if [ "$what" = s6c ]; then
  # Session 6, call 6: nvidia at M = 1 with 4-head combine programs (the default now), twice,
  # and with 16 KB split-K GEMV tiles; then the attention and step tests.
  for run in 1 2; do b --backend nvidia --tp 4 --tokens 1 | sed "s/^/run $run, tp 4: /"; done
  DSV41_GEMV_SPLIT_TILE=16384 b --backend nvidia --tp 4 --tokens 1 | sed "s/^/16 KB tiles, tp 4: /"
  b --backend nvidia --tp 2 --tokens 1 | sed "s/^/tp 2: /"
  DSV41_GEMV_SPLIT_TILE=16384 b --backend nvidia --tp 2 --tokens 1 | sed "s/^/16 KB tiles, tp 2: /"
  python3 -m pytest -q -p no:cacheprovider tests/gpu/test_mega_attention_gpu.py \
    tests/gpu/test_nvidia_step_gpu.py --timeout 300 2>&1 | tail -3
fi
if [ "$what" = s6tests ]; then
  # Session 6, call 5: both step test files on the final tree.
  python3 -m pytest -q -p no:cacheprovider tests/gpu/test_nvidia_step_gpu.py \
    tests/gpu/test_mono_gpu.py --timeout 500 2>&1 | tee "$OUT/gpu_tests.log" | tail -6
fi
if [ "$what" = next ]; then
  # Prepared for session 7, not yet run (then `next-tests`): mono GEMV tasks taking the next
  # ticket while their first weight blocks are in flight (DSV41_MONO_TICKET_AHEAD=1) against
  # the default, and its trace; the nvidia tables on today's tree (4-head combine programs);
  # nvidia with whole-row Wqkv / wq_b tiles padded to one K step (DSV41_GEMV_PAD=1), and with
  # one-block attention splits reading their keys before the PDL wait (DSV41_ATTN_EARLY=1).
  for ahead in 0 1; do
    DSV41_MONO_TICKET_AHEAD=$ahead b --backend mono --tp 4 --tokens 1,16,48 \
      | sed "s/^/ticket ahead $ahead: /"
  done
  DSV41_MONO_TICKET_AHEAD=1 timeout 120 python3 benchmarks/mono_trace.py --tp 4 --tokens 1 \
    2>&1 | tail -11
  b --backend nvidia --tp 4 --tokens 1,2,4,8,16,32,48 | sed "s/^/tp 4: /"
  b --backend nvidia --tp 2 --tokens 1,16,48 | sed "s/^/tp 2: /"
  for tp in 4 2; do
    DSV41_GEMV_PAD=1 b --backend nvidia --tp "$tp" --tokens 1 | sed "s/^/padded, tp $tp: /"
    DSV41_ATTN_EARLY=1 b --backend nvidia --tp "$tp" --tokens 1 | sed "s/^/early keys, tp $tp: /"
  done
fi
if [ "$what" = next-tests ]; then
  # Prepared for session 7: the attention and mono GPU tests of today's tree, nvidia's step
  # with DSV41_GEMV_PAD=1 and DSV41_ATTN_EARLY=1 (about 8 minutes).
  python3 -m pytest -q -p no:cacheprovider tests/gpu/test_mega_attention_gpu.py \
    tests/gpu/test_mono_gpu.py --timeout 500 2>&1 | tail -2
  DSV41_GEMV_PAD=1 DSV41_ATTN_EARLY=1 python3 -m pytest -q -p no:cacheprovider \
    tests/gpu/test_nvidia_step_gpu.py --timeout 300 2>&1 | tail -2
fi
if [ "$what" = pdl ]; then
  # Session 6, call 1: PDL with wq_b's side stream through the nvidia step tests, then the
  # step at both shares with and without it.
  DSV41_PDL=1 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_nvidia_step_gpu.py \
    --timeout 300 2>&1 | tail -3
  for pdl in 0 1; do
    for tp in 4 2; do
      DSV41_PDL=$pdl timeout 150 python3 -m dsv41.cli bench --backend nvidia --config dsv41-flash \
        --tp "$tp" --tokens 1,2,16 --reference-repeats 1 2>&1 | grep -E "^nvidia " \
        | sed "s/^/PDL $pdl, tp $tp: /"
    done
  done
fi
if [ "$what" = sweep ]; then
  # Session 6, call 2: each GEMM site at M = 1 over the CUDA-core tiles, whole-K tiles (no
  # split-K sum) included, and with its weights in L2.
  timeout 400 python3 benchmarks/profile_step.py --tp 4 --tokens 1 --sweep 2>&1 | tail -48
fi
if [ "$what" = steps ]; then
  # The step tests of both backends (the kernels session 5 changed) and parity.
  python3 -m pytest -q -p no:cacheprovider tests/gpu/test_nvidia_step_gpu.py \
    tests/gpu/test_mono_gpu.py --timeout 500 2>&1 | tee "$OUT/gpu_tests.log" | tail -6
  python3 -m dsv41.cli parity --config dsv41-flash --tp 4 --tokens 1 2>&1 | tail -3
fi
if [ "$what" = s7 ]; then
  # Session 7, call 3: the L2 prefetch of wq_b, wo_a and wo_b at the step's start
  # (DSV41_L2_PREFETCH, since removed: slower) against off; the tables with it on.
  for run in 1 2; do
    for pf in 1 0; do
      DSV41_L2_PREFETCH=$pf b --backend nvidia --tp 4 --tokens 1 \
        | sed "s/^/run $run, prefetch $pf, tp 4: /"
    done
  done
  for pf in 1 0; do
    DSV41_L2_PREFETCH=$pf b --backend mono --tp 4 --tokens 1,16,48 | sed "s/^/prefetch $pf, tp 4: /"
    DSV41_L2_PREFETCH=$pf b --backend nvidia,mono --tp 2 --tokens 1,16,48 \
      | sed "s/^/prefetch $pf, tp 2: /"
  done
  b --backend nvidia --tp 4 --tokens 2,4,8,16,32,48 --json "$OUT/bench_tp4.json" | sed "s/^/tp 4: /"
  DSV41_L2_PREFETCH=0 b --backend nvidia --tp 4 --tokens 16,48 | sed "s/^/prefetch 0, tp 4: /"
  b --backend mono --tp 4 --tokens 2,4,8,32 | sed "s/^/tp 4: /"
  python3 -m pytest -q -p no:cacheprovider tests/gpu/test_nvidia_step_gpu.py \
    tests/gpu/test_mono_gpu.py -k "nvidia_step or prefetch" --timeout 300 2>&1 | tail -3
fi
if [ "$what" = s7-final ]; then
  # Session 7, last call: nvidia at M = 1 with combine programs of 4 (default), 2 and 1 heads
  # (DSV41_COMBINE_HEADS, since removed);
  # mono with 32-key attention tasks against 64; both tables; the nvidia step tests with
  # 2-head combine programs, and the attention tests.
  for ch in 4 2 1 4; do
    DSV41_COMBINE_HEADS=$ch b --backend nvidia --tp 4 --tokens 1 \
      | sed "s/^/combine heads $ch, tp 4: /"
  done
  DSV41_COMBINE_HEADS=2 b --backend nvidia --tp 2 --tokens 1 | sed "s/^/combine heads 2, tp 2: /"
  DSV41_MONO_KEY_CHUNK=32 b --backend mono --tp 4 --tokens 1,16,48 | sed "s/^/key chunk 32, tp 4: /"
  b --backend nvidia,mono --tp 4 --tokens 1,2,4,8,16,32,48 --json "$OUT/bench_tp4.json" \
    | sed "s/^/tp 4: /"
  b --backend nvidia,mono --tp 2 --tokens 1,16,48 --json "$OUT/bench_tp2.json" | sed "s/^/tp 2: /"
  DSV41_COMBINE_HEADS=2 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_nvidia_step_gpu.py \
    tests/gpu/test_mega_attention_gpu.py --timeout 300 2>&1 | tail -2
fi
if [ "$what" = s8 ]; then
  # Prepared for session 8 (about 5 minutes): mono's one-token GEMV on weights held as int32
  # words (DSV41_MONO_GEMV_WORDS=1) against the default, both shares, and its trace; mono's
  # tensor-core GEMV blocks cut into 4 or 8 K segments against 1.
  ab DSV41_MONO_GEMV_WORDS "0 1 0 1" --backend mono --tp 4 --tokens 1
  ab DSV41_MONO_GEMV_WORDS "0 1" --backend mono --tp 2 --tokens 1
  DSV41_MONO_GEMV_WORDS=1 timeout 120 python3 benchmarks/mono_trace.py --tp 4 --tokens 1 \
    2>&1 | tail -11
  # tensor-core GEMV blocks cut into K segments (DSV41_MONO_MMA_SPLIT) at M = 8, 16, 48
  ab DSV41_MONO_MMA_SPLIT "1 4 8 1" --backend mono --tp 4 --tokens 8,16,48
fi
if [ "$what" = s8-tests ]; then
  # Prepared for session 8 (about 5 minutes): the mono GPU tests with the words on (they
  # change the one-token steps) and the K segments of the better split (SPLIT, default 8).
  DSV41_MONO_GEMV_WORDS=1 DSV41_MONO_MMA_SPLIT=${SPLIT:-8} python3 -m pytest -q \
    -p no:cacheprovider tests/gpu/test_mono_gpu.py \
    --timeout 500 2>&1 | tail -2
fi
if [ "$what" = s8b ]; then
  # Session 8, call 2 (about 4 minutes): the tables with the words and K segments on by
  # default; tensor cores with 8 segments at M = 2, 4 (CUDA cores for one token only); 8 and
  # 4 segments at M = 32; mono's trace at M = 16.
  b --backend nvidia,mono --tp 4 --tokens 1,2,4,8,16,32,48 --json "$OUT/bench_tp4.json" \
    | sed "s/^/tp 4: /"
  b --backend nvidia,mono --tp 2 --tokens 1,16,48 --json "$OUT/bench_tp2.json" | sed "s/^/tp 2: /"
  DSV41_MONO_GEMV_CORES=1 b --backend mono --tp 4 --tokens 2,4 | sed "s/^/cores 1: /"
  DSV41_MONO_GEMV_CORES=1 b --backend mono --tp 2 --tokens 2,4 | sed "s/^/cores 1, tp 2: /"
  b --backend mono --tp 2 --tokens 2,4 | sed "s/^/cores 4, tp 2: /"
  for split in 8 4; do
    DSV41_MONO_MMA_SPLIT=$split b --backend mono --tp 4 --tokens 32 | sed "s/^/split $split: /"
  done
  timeout 120 python3 benchmarks/mono_trace.py --tp 4 --tokens 16 2>&1 | tail -11
fi
if [ "$what" = s8c ]; then
  # Session 8, call 3 (about 8 minutes): the mono GPU tests at both shares with today's
  # defaults (words at one token, CUDA cores up to 2 tokens, 8 K segments up to 16).
  python3 -m pytest -q -p no:cacheprovider tests/gpu/test_mono_gpu.py --timeout 500 2>&1 | tail -3
fi
if [ "$what" = s8d ]; then
  # Session 8, call 4 (about 3 minutes): one token's wq_b and wo_b tasks two at once
  # (DSV41_MONO_PAIRS) against one at a time, both shares, and its trace; nvidia's split-K
  # CUDA-core tiles of 4 KB against 8 KB at M = 1.
  ab DSV41_MONO_PAIRS "0 1 0 1" --backend mono --tp 4 --tokens 1
  ab DSV41_MONO_PAIRS "0 1" --backend mono --tp 2 --tokens 1
  DSV41_MONO_PAIRS=1 timeout 120 python3 benchmarks/mono_trace.py --tp 4 --tokens 1 2>&1 | tail -11
  ab DSV41_GEMV_SPLIT_TILE "4096 8192" --backend nvidia --tp 4 --tokens 1
fi
if [ "$what" = s8e ]; then
  # Session 8, call 5 (about 3 minutes): one token's GEMV tasks in pairs, wq_b and wo_b only
  # (DSV41_MONO_PAIRS=1, the default) or every GEMV stage (2, since removed), against none (0);
  # the trace of 2.
  ab DSV41_MONO_PAIRS "0 1 2 1 2" --backend mono --tp 4 --tokens 1
  ab DSV41_MONO_PAIRS "1 2" --backend mono --tp 2 --tokens 1
  DSV41_MONO_PAIRS=2 timeout 120 python3 benchmarks/mono_trace.py --tp 4 --tokens 1 2>&1 | tail -11
fi
if [ "$what" = s8f ]; then
  # Session 8, call 6 (about 7 minutes): the mono GPU tests with today's defaults (one token's
  # wq_b and wo_b tasks in pairs), then the tables at both shares.
  python3 -m pytest -q -p no:cacheprovider tests/gpu/test_mono_gpu.py --timeout 400 2>&1 | tail -3
  b --backend nvidia,mono --tp 4 --tokens 1,2,4,8,16,32,48 --json "$OUT/bench_tp4.json" \
    | sed "s/^/tp 4: /"
  b --backend nvidia,mono --tp 2 --tokens 1,16,48 --json "$OUT/bench_tp2.json" | sed "s/^/tp 2: /"
fi
if [ "$what" = s8g ]; then
  # Session 8, call 7 (about 1.5 minutes): mono's attention in 32-key tasks against 64 at M = 1,
  # and the trace with 32 (does an attention task's time follow its keys?).
  ab DSV41_MONO_KEY_CHUNK "64 32" --backend mono --tp 4 --tokens 1
  DSV41_MONO_KEY_CHUNK=32 timeout 120 python3 benchmarks/mono_trace.py --tp 4 --tokens 1 \
    2>&1 | tail -11
fi
if [ "$what" = s9 ]; then
  # Prepared for session 9 (about 3 minutes): mono's combine with 4 chunks' partials a load
  # (DSV41_MONO_COMBINE_AHEAD=4) with 32- and 64-key attention tasks at M = 1, both shares,
  # the trace of 32 keys with it, and at M = 16 and 48 the combine alone and with 32 keys.
  # (Session 9's call 1; the switch was removed after it.)
  for run in "64 1" "32 1" "64 4" "32 4" "64 1" "32 4"; do
    set -- $run
    DSV41_MONO_KEY_CHUNK=$1 DSV41_MONO_COMBINE_AHEAD=$2 b --backend mono --tp 4 --tokens 1 \
      | sed "s/^/keys $1, ahead $2, tp 4: /"
  done
  for run in "64 1" "32 4"; do
    set -- $run
    DSV41_MONO_KEY_CHUNK=$1 DSV41_MONO_COMBINE_AHEAD=$2 b --backend mono --tp 2 --tokens 1 \
      | sed "s/^/keys $1, ahead $2, tp 2: /"
  done
  DSV41_MONO_KEY_CHUNK=32 DSV41_MONO_COMBINE_AHEAD=4 timeout 120 python3 benchmarks/mono_trace.py \
    --tp 4 --tokens 1 2>&1 | tail -11
  ab DSV41_MONO_COMBINE_AHEAD "1 4" --backend mono --tp 4 --tokens 16,48
  DSV41_MONO_COMBINE_AHEAD=4 ab DSV41_MONO_KEY_CHUNK "32" --backend mono --tp 4 --tokens 16,48
fi
if [ "$what" = s9b ]; then
  # Session 9, call 2 (about 6 minutes): mono's weight words at 2 tokens (and at 3 and 4 with
  # CUDA cores up to 4), the trace at M = 2; nvidia's CUDA-core loop at 2 tokens, PDL off / on.
  ab DSV41_MONO_GEMV_WORDS "0 1 0 1" --backend mono --tp 4 --tokens 2
  ab DSV41_MONO_GEMV_WORDS "0 1" --backend mono --tp 2 --tokens 2
  ab DSV41_MONO_GEMV_CORES "2 4 2 4" --backend mono --tp 4 --tokens 3,4
  DSV41_MONO_GEMV_CORES=4 ab DSV41_MONO_GEMV_WORDS "1" --backend mono --tp 2 --tokens 4
  ab DSV41_MONO_GEMV_CORES "2" --backend mono --tp 2 --tokens 4
  b --backend mono --tp 4 --tokens 1 | sed "s/^/defaults: /"
  timeout 120 python3 benchmarks/mono_trace.py --tp 4 --tokens 2 2>&1 | tail -11
  for pdl in 0 1; do
    DSV41_PDL=$pdl ab DSV41_GEMV_MAX_M "1 2" --backend nvidia --tp 4 --tokens 2 \
      | sed "s/^/PDL $pdl /"
  done
fi
if [ "$what" = s9c ]; then
  # Session 9, call 3 (about 5 minutes): nvidia's CUDA-core loop and PDL up to 2 tokens (the
  # defaults) against session 8's (MMA loop, no PDL at 2), up to 4 tokens; then the tables.
  for run in 1 2; do
    b --backend nvidia --tp 4 --tokens 2,4 | sed "s/^/defaults: /"
    DSV41_GEMV_MAX_M=1 DSV41_PDL=0 b --backend nvidia --tp 4 --tokens 2 | sed "s/^/session 8: /"
  done
  DSV41_GEMV_MAX_M=4 DSV41_PDL=1 b --backend nvidia --tp 4 --tokens 4 | sed "s/^/GEMV, PDL to 4: /"
  b --backend nvidia,mono --tp 4 --tokens 1,2,4,8,16,32,48 --json "$OUT/bench_tp4.json" \
    | sed "s/^/tp 4: /"
  b --backend nvidia,mono --tp 2 --tokens 1,2,4,16,48 --json "$OUT/bench_tp2.json" \
    | sed "s/^/tp 2: /"
fi
if [ "$what" = s9d ]; then
  # Session 9, call 5 (about 3 minutes): the tables of the session's final tree.
  b --backend nvidia,mono --tp 4 --tokens 1,2,4,8,16,32,48 --json "$OUT/bench_tp4.json" \
    | sed "s/^/tp 4: /"
  b --backend nvidia,mono --tp 2 --tokens 1,2,4,16,48 --json "$OUT/bench_tp2.json" \
    | sed "s/^/tp 2: /"
fi
if [ "$what" = s9-tests ]; then
  # Session 9, call 4 (about 9 minutes): nvidia at tp 2, M = 2 against session 8's loop; mono
  # at M = 8 on CUDA cores in 128-column K blocks, at M = 4 in 256; then the mono GPU tests
  # (weight words up to 4 tokens) and nvidia's step tests (CUDA-core loop, PDL up to 2 tokens).
  b --backend nvidia --tp 2 --tokens 2 | sed "s/^/defaults: /"
  DSV41_GEMV_MAX_M=1 DSV41_PDL=0 b --backend nvidia --tp 2 --tokens 2 | sed "s/^/session 8: /"
  b --backend mono --tp 4 --tokens 4,8 | sed "s/^/defaults: /"
  DSV41_MONO_GEMV_CORES=8 DSV41_MONO_GEMV_BLOCK=128 b --backend mono --tp 4 --tokens 8 \
    | sed "s/^/cores 8, blocks 128: /"
  DSV41_MONO_GEMV_BLOCK=256 b --backend mono --tp 4 --tokens 4 | sed "s/^/blocks 256: /"
  python3 -m pytest -q -p no:cacheprovider tests/gpu/test_mono_gpu.py \
    tests/gpu/test_nvidia_step_gpu.py --timeout 400 2>&1 | tail -3
fi
if [ "$what" = s10 ]; then
  # Session 10, call 1 (about 4 minutes): mono's attention tasks in one 64-key slice against
  # two of 32, at tp 4 / tp 2, and the traces of both; nvidia with one layer's weights
  # (L2-resident between replays) against the default (HBM): how much of its step is latency.
  ab DSV41_MONO_KEY_SLICE "32 64 32 64" --backend mono --tp 4 --tokens 1
  ab DSV41_MONO_KEY_SLICE "32 64" --backend mono --tp 4 --tokens 16,48
  ab DSV41_MONO_KEY_SLICE "32 64" --backend mono --tp 2 --tokens 1
  for slice in 32 64; do
    echo "trace, $slice-key slices:"
    DSV41_MONO_KEY_SLICE=$slice timeout 120 python3 benchmarks/mono_trace.py --tp 4 --tokens 1 \
      2>&1 | tail -11
  done
  for layers in 1 0; do
    if [ "$layers" = 0 ]; then set --; else set -- --layers "$layers"; fi
    b --backend nvidia --tp 4 --tokens 1,16 "$@" | sed "s/^/layers ${layers/#0/default}: /"
  done
fi
if [ "$what" = s10b ]; then
  # Session 10, call 2 (about 3 minutes): nvidia's graph-replayed step cut after each launch
  # (what each launch adds in the graph), tp 4 at M = 1 and 16, tp 2 at M = 1; attention alone
  # by split count at M = 1.
  timeout 200 python3 benchmarks/profile_step.py --tp 4 --tokens 1,16 --chain --attn-sweep \
    2>&1 | tail -30
  timeout 150 python3 benchmarks/profile_step.py --tp 2 --tokens 1 --chain 2>&1 | tail -9
fi
if [ "$what" = s10c ]; then
  # Session 10, call 3 (about 4 minutes): nvidia's attention launches by key-table split count
  # at every M, both shares.
  timeout 250 python3 benchmarks/profile_step.py --tp 4 --tokens 2,4,8,16,32,48 --attn-sweep \
    2>&1 | grep -E "attention|splits"
  timeout 250 python3 benchmarks/profile_step.py --tp 2 --tokens 1,2,4,8,16,48 --attn-sweep \
    2>&1 | grep -E "attention|splits"
fi
if [ "$what" = s10d ]; then
  # Session 10, call 4 (about 6 minutes): nvidia's attention splits at 1 program a SM up to 16
  # tiles and 2 above (the new default) against 4 (before), 3 at M = 32 / 48; PDL at M > 1 with
  # the MMA GEMMs releasing the next kernel after their K loop (DSV41_PDL_LATE) or at the start.
  for tp in 4 2; do
    b --backend nvidia --tp $tp --tokens 1,2,4,8,16,32,48 | sed "s/^/tp $tp, defaults: /"
    DSV41_ATTN_PROGRAMS_PER_SM=4 b --backend nvidia --tp $tp --tokens 4,8,16,32,48 \
      | sed "s/^/tp $tp, 4 a SM: /"
    DSV41_ATTN_PROGRAMS_PER_SM=3 b --backend nvidia --tp $tp --tokens 32,48 \
      | sed "s/^/tp $tp, 3 a SM: /"
  done
  DSV41_PDL=1 ab DSV41_PDL_LATE "0 1" --backend nvidia --tp 4 --tokens 2,8,16
  DSV41_PDL=1 ab DSV41_PDL_LATE "0 1" --backend nvidia --tp 2 --tokens 2,16
fi
if [ "$what" = s10e ]; then
  # Session 10, call 5 (about 7 minutes): nvidia's GPU tests (attention splits in tiers), the
  # tables of both backends at both shares, 3 attention programs a SM at M = 48 again, and the
  # step cut after each launch at tp 4, M = 16.
  python3 -m pytest -q -p no:cacheprovider tests/gpu/test_nvidia_step_gpu.py \
    tests/gpu/test_mega_attention_gpu.py --timeout 400 2>&1 | tail -3
  for tp in 4 2; do
    b --backend nvidia,mono --tp $tp --tokens 1,2,4,8,16,32,48 --json "$OUT/bench_tp$tp.json" \
      | sed "s/^/tp $tp: /"
    DSV41_ATTN_PROGRAMS_PER_SM=3 b --backend nvidia --tp $tp --tokens 48 | sed "s/^/tp $tp, 3: /"
  done
  timeout 150 python3 benchmarks/profile_step.py --tp 4 --tokens 16 --chain 2>&1 | tail -8
fi
if [ "$what" = s10f ]; then
  # Session 10, call 6 (about 3 minutes): a fourth attention tier (3 programs a SM past 64
  # tiles, tp 2 at M = 48): nvidia's GPU tests with it, and M = 48 at both shares.
  python3 -m pytest -q -p no:cacheprovider tests/gpu/test_nvidia_step_gpu.py \
    tests/gpu/test_mega_attention_gpu.py --timeout 400 2>&1 | tail -3
  for tp in 4 2; do b --backend nvidia --tp $tp --tokens 32,48 | sed "s/^/tp $tp: /"; done
fi
if [ "$what" = s10g ]; then
  # Session 10, call 7: the mono GPU tests on the session's final tree (the attention key slice
  # now a constexpr from the plan). On a fresh machine it needs more than 390 s (killed there).
  python3 -m pytest -q -p no:cacheprovider tests/gpu/test_mono_gpu.py --timeout 400 2>&1 | tail -3
fi
if [ "$what" = s11 ]; then
  # Session 11, call 1: every GPU test on the session's starting tree, the mono tests split by
  # share into two processes (each compiles its own kernels), on the second GPU if there is one.
  second=$(( $(nvidia-smi -L | wc -l) > 1 ? 1 : 0 ))
  (CUDA_VISIBLE_DEVICES=0 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_mono_gpu.py \
    -k tp2 --timeout 500 > "$OUT/mono_tp2.log" 2>&1
   CUDA_VISIBLE_DEVICES=0 python3 -m pytest -q -p no:cacheprovider \
    tests/gpu/test_nvidia_step_gpu.py tests/gpu/test_mega_attention_gpu.py --timeout 400 \
    > "$OUT/nvidia.log" 2>&1) &
  CUDA_VISIBLE_DEVICES=$second python3 -m pytest -q -p no:cacheprovider tests/gpu/test_mono_gpu.py \
    -k tp4 --timeout 500 > "$OUT/mono_tp4.log" 2>&1
  wait
  for f in mono_tp2 mono_tp4 nvidia; do echo "== $f"; tail -3 "$OUT/$f.log"; done
fi
# Session 11, calls 2 and 3 (about 5 minutes): kv's norm, RoPE and insert in wq_b's launch at one
# token (DSV41_KV_IN_WQB=1, then the default) against the norm kernel on a side stream (0):
# nvidia's GPU tests, A/B at M = 1 (tp 4 twice, tp 2), the step cut after each launch with each.
# (The switch was removed after call 3.)
kv_tail_ab() {
  python3 -m pytest -q -p no:cacheprovider tests/gpu/test_nvidia_step_gpu.py \
    tests/gpu/test_mega_attention_gpu.py --timeout 400 2>&1 | tail -3
  for r in 1 2; do ab DSV41_KV_IN_WQB "1 0" --backend nvidia --tp 4 --tokens 1; done
  ab DSV41_KV_IN_WQB "1 0" --backend nvidia --tp 2 --tokens 1
  for v in 1 0; do
    DSV41_KV_IN_WQB=$v timeout 150 python3 benchmarks/profile_step.py --tp 4 --tokens 1 --chain \
      2>&1 | tail -7 | sed "s/^/KV_IN_WQB=$v /"
  done
}
if [ "$what" = s11b ]; then
  kv_tail_ab
fi
if [ "$what" = s11c ]; then
  # Session 11, call 3 (about 7 minutes): s11b again (its kernels now compile on Triton 3.6), and
  # the CUDA-core loop at 2 and 4 tokens with a program a token row (DSV41_GEMV_ROWS=1) and PDL.
  kv_tail_ab
  for tp in 4 2; do
    b --backend nvidia --tp $tp --tokens 2,4 | sed "s/^/tp $tp default: /"
    DSV41_GEMV_MAX_M=4 DSV41_GEMV_ROWS=1 DSV41_PDL=1 b --backend nvidia --tp $tp --tokens 2,4 \
      | sed "s/^/tp $tp rows 1, PDL: /"
  done
fi
if [ "$what" = s11d ]; then
  # Session 11, call 4 (about 5 minutes): an L2 prefetch of each attention split's records before
  # its loop (DSV41_ATTN_PREFETCH, splits of several key blocks, 4 tokens and up): nvidia's GPU
  # tests with it, and A/B at both shares.
  python3 -m pytest -q -p no:cacheprovider tests/gpu/test_nvidia_step_gpu.py \
    tests/gpu/test_mega_attention_gpu.py --timeout 400 2>&1 | tail -3
  for tp in 4 2; do ab DSV41_ATTN_PREFETCH "1 0" --backend nvidia --tp $tp --tokens 4,8,16,32,48; done
fi
if [ "$what" = s11e ]; then
  # Session 11, call 5 (about 7 minutes): attention programs of 8 warps (DSV41_ATTN_WARPS=8):
  # nvidia's GPU tests with them, A/B against 4 at every M and both shares (the default tree's
  # nvidia tables), the step cut after each launch at tp 4, M = 2, and attention's counters
  # at tp 4, M = 16 (4 warps). (The warps switch was removed after the call.)
  DSV41_ATTN_WARPS=8 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_nvidia_step_gpu.py \
    tests/gpu/test_mega_attention_gpu.py --timeout 400 2>&1 | tail -3
  for tp in 4 2; do
    ab DSV41_ATTN_WARPS "8 4" --backend nvidia --tp $tp --tokens 1,2,4,8,16,32,48
  done
  timeout 100 python3 benchmarks/profile_step.py --tp 4 --tokens 2 --chain 2>&1 | tail -8
  M="gpu__time_duration.sum,sm__warps_active.avg.pct_of_peak_sustained_active"
  M="$M,launch__registers_per_thread,launch__grid_size,smsp__inst_executed.sum"
  M="$M,dram__bytes_read.sum,lts__t_bytes.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum"
  M="$M,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
  timeout 120 /usr/local/cuda/bin/ncu --clock-control none -k regex:mega_attention_kernel \
    --launch-skip 2 --launch-count 1 --metrics "$M" python3 benchmarks/ncu_steps.py \
    --backend nvidia --tokens 16 > "$OUT/ncu_attn.txt" 2>&1
  grep -E "gpu__time|warps_active|launch__|inst_exec|bytes|bank_conf" "$OUT/ncu_attn.txt" \
    | sed -E 's/ +/ /g'
  grep -E "issue_stalled" "$OUT/ncu_attn.txt" | sed -E 's/ +/ /g;s/smsp__average_warps_issue_stalled_//' \
    | awk '$NF+0 >= 0.3'
fi
if [ "$what" = s11f ]; then
  # Session 11, call 6 (about 7 minutes): the final tree's tables, both backends at both shares,
  # then nvidia's GPU tests on it (mono's kernel is the one call 1 tested).
  tables nvidia,mono
  python3 -m pytest -q -p no:cacheprovider tests/gpu/test_nvidia_step_gpu.py \
    tests/gpu/test_mega_attention_gpu.py --timeout 400 2>&1 | tail -3
fi
if [ "$what" = s11g ]; then
  # Session 11, call 7 (about 6 minutes): the MMA loop on e4m3 tensor cores, weight rows as the
  # MMA's M (DSV41_FP8_MMA=1): nvidia's GPU tests with it, then A/B at 2 to 48 tokens. (The
  # loop and its switch were removed after the call.)
  DSV41_FP8_MMA=1 timeout 220 python3 -m pytest -q -p no:cacheprovider \
    tests/gpu/test_nvidia_step_gpu.py tests/gpu/test_mega_attention_gpu.py --timeout 200 2>&1 \
    | tail -4
  for tp in 4 2; do ab DSV41_FP8_MMA "1 0" --backend nvidia --tp $tp --tokens 2,4,8,16,32,48; done
fi
if [ "$what" = s11h ]; then
  # Session 11, call 7 (the last 4 minutes of device time): the score dot in 4 segments of the
  # 512 dims (DSV41_ATTN_QK_SPLIT=4) against one, at tp 4; then the GPU tests with it, as far
  # as the time goes.
  ab DSV41_ATTN_QK_SPLIT "4 1" --backend nvidia --tp 4 --tokens 1,4,16,48
  DSV41_ATTN_QK_SPLIT=4 timeout 90 python3 -m pytest -q -p no:cacheprovider \
    tests/gpu/test_mega_attention_gpu.py --timeout 80 2>&1 | tail -3
  DSV41_ATTN_QK_SPLIT=4 timeout 100 python3 -m pytest -q -p no:cacheprovider \
    tests/gpu/test_nvidia_step_gpu.py --timeout 90 2>&1 | tail -3
fi
if [ "$what" = s12 ]; then
  # Session 12, call 1 (about 7 minutes): mono's one-token GEMV tasks whole, every weight word in
  # flight before the wait (DSV41_MONO_GEMV_WHOLE, a task's most weight bytes) against streamed
  # K blocks (0): A/B at M = 1, both shares; the trace at tp 4, M = 1, with each; mono's tp 4 GPU
  # tests with the new default. (Slower at every size; the switch was removed after the call.)
  ab DSV41_MONO_GEMV_WHOLE "40960 0 32768 65536" --backend mono --tp 4 --tokens 1
  ab DSV41_MONO_GEMV_WHOLE "40960 0" --backend mono --tp 4 --tokens 1
  ab DSV41_MONO_GEMV_WHOLE "40960 0" --backend mono --tp 2 --tokens 1
  for v in 40960 0; do
    DSV41_MONO_GEMV_WHOLE=$v timeout 100 python3 benchmarks/mono_trace.py --tp 4 --tokens 1 2>&1 \
      | tail -14 | sed "s/^/WHOLE=$v /"
  done
  timeout 220 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_mono_gpu.py -k tp4 \
    --timeout 200 2>&1 | tail -4
fi
if [ "$what" = s12b ]; then
  # Session 12, call 2 (about 8 minutes): the CUDA-core GEMV's weight tile with its MX blocks
  # outermost ([blocks, rows, 32]: a thread holds one block's columns of 4 rows; 48 registers
  # at M = 1 against 64 to 72 on SM90): nvidia's GPU tests with it; A/B against the kernel
  # before it (benchmarks/_s12_ab.py, a file of that call only) at M = 1 and, with the loop and
  # PDL up to 4 tokens, at M = 2 and 4; then the bench graph's kernel timeline at tp 4. (The
  # old kernel's runs failed to start: _s12_ab.py did not register its module.)
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_nvidia_step_gpu.py \
    tests/gpu/test_mega_attention_gpu.py --timeout 190 2>&1 | tail -4
  old() { timeout 200 python3 benchmarks/_s12_ab.py bench --config dsv41-flash \
    --reference-repeats 1 "$@" 2>&1 | grep -E "^nvidia "; }
  for r in 1 2; do
    b --backend nvidia --tp 4 --tokens 1 | sed "s/^/tp 4 new: /"
    old --backend nvidia --tp 4 --tokens 1 | sed "s/^/tp 4 old: /"
  done
  b --backend nvidia --tp 2 --tokens 1 | sed "s/^/tp 2 new: /"
  old --backend nvidia --tp 2 --tokens 1 | sed "s/^/tp 2 old: /"
  for tp in 4 2; do
    DSV41_GEMV_MAX_M=4 DSV41_PDL=1 b --backend nvidia --tp $tp --tokens 2,4 \
      | sed "s/^/tp $tp new loop+PDL: /"
    b --backend nvidia --tp $tp --tokens 2,4 | sed "s/^/tp $tp default: /"
  done
  timeout 120 python3 benchmarks/profile_step.py --tp 4 --tokens 1,2 --timeline 2>&1 | tail -24
fi
if [ "$what" = s12c ]; then
  # Session 12, call 3 (about 8 minutes): the new defaults (the CUDA-core loop and PDL up to 2
  # tokens): nvidia's GPU tests; A/B at M = 1 and 2 against the GEMV kernel before the tile
  # change (benchmarks/_s12_ab.py, now registering its module; a file of calls 2 and 3 only), in
  # the same call; nvidia's tables at both shares; the kernel timeline at tp 4, M = 2.
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_nvidia_step_gpu.py \
    tests/gpu/test_mega_attention_gpu.py --timeout 190 2>&1 | tail -4
  old() { timeout 200 python3 benchmarks/_s12_ab.py bench --config dsv41-flash \
    --reference-repeats 1 "$@" 2>&1 | grep -E "^nvidia |Error" | tail -3; }
  for tp in 4 2; do
    old --backend nvidia --tp $tp --tokens 1,2 | sed "s/^/tp $tp old: /"
    b --backend nvidia --tp $tp --tokens 1,2,4,8,16,32,48 --json "$OUT/bench_tp$tp.json" \
      | sed "s/^/tp $tp new: /"
  done
  old --backend nvidia --tp 4 --tokens 1 | sed "s/^/tp 4 old again: /"
  b --backend nvidia --tp 4 --tokens 1 | sed "s/^/tp 4 new again: /"
  timeout 100 python3 benchmarks/profile_step.py --tp 4 --tokens 2 --timeline 2>&1 | tail -9
fi
if [ "$what" = s12d ]; then
  # Session 12, call 4 (about 5 minutes): the CUDA-core tiles again now that a program holds
  # fewer registers: split-K tile bytes (DSV41_GEMV_SPLIT_TILE) and whole rows in up to 5 K
  # steps (DSV41_GEMV_STEPS=5), at one and two tokens, both shares.
  for tp in 4 2; do
    ab DSV41_GEMV_SPLIT_TILE "8192 16384 4096" --backend nvidia --tp $tp --tokens 1,2
    ab DSV41_GEMV_STEPS "5" --backend nvidia --tp $tp --tokens 1,2
  done
fi
if [ "$what" = s12e ]; then
  # Session 12, call 5 (about 5 minutes): the one- and two-token switches again with the new
  # GEMV tiles: the norm kernel on the chain before wq_b (DSV41_NORM_IN_WQB=0), attention's
  # early key reads off (DSV41_ATTN_EARLY=0), one score segment (DSV41_ATTN_QK_SPLIT=1).
  for tp in 4 2; do ab DSV41_NORM_IN_WQB "1 0" --backend nvidia --tp $tp --tokens 1,2; done
  ab DSV41_ATTN_EARLY "0" --backend nvidia --tp 4 --tokens 1,2
  ab DSV41_ATTN_QK_SPLIT "1" --backend nvidia --tp 4 --tokens 1,2
fi
if [ "$what" = s12f ]; then
  # Session 12, call 6 (about 3 minutes): wo_b in 4-row whole-row tiles of 4 warps
  # (DSV41_GEMV_TILE=8192: 40 registers, room for 3 programs a SM beside wo_a's) against 8 rows of
  # 8 warps (the default 16 KB), at one and two tokens, both shares.
  for tp in 4 2; do ab DSV41_GEMV_TILE "8192 16384" --backend nvidia --tp $tp --tokens 1,2; done
fi
if [ "$what" = s12g ]; then
  # Session 12, call 7 (about 4 minutes): wo_a's split-K tiles of 16 KB (DSV41_GEMV_QUANT_TILE:
  # 8 K splits of 32 rows x 512, 8 warps) against 8 KB (16 splits of 32 x 256), at one and two
  # tokens; the score dot in 8 or 2 segments at one token; nvidia's step tests with 16 KB.
  for tp in 4 2; do ab DSV41_GEMV_QUANT_TILE "8192 16384" --backend nvidia --tp $tp --tokens 1,2; done
  ab DSV41_ATTN_QK_SPLIT "8 2" --backend nvidia --tp 4 --tokens 1
  DSV41_GEMV_QUANT_TILE=16384 timeout 100 python3 -m pytest -q -p no:cacheprovider \
    tests/gpu/test_nvidia_step_gpu.py --timeout 90 2>&1 | tail -3
fi
if [ "$what" = s17 ]; then
  # Session 17, call 1 (about 7 minutes): wq_b's epilogue RoPEs q for attention (RopeOut; SM90
  # SASS after the wait, Triton 3.6, tp 4, M = 1: attention 919 -> 693 lines, wq_b 600 -> 621)
  # and the combine's split offsets as load immediates (1118 -> 735 lines): nvidia's step and
  # attention GPU tests; A/B against 6d2d530 (a copy in _old/, not committed) at one and two
  # tokens; q turned by attention (DSV41_Q_ROPE_IN_WQB=0) against wq_b at 1, 16 and 48 tokens.
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_nvidia_step_gpu.py \
    tests/gpu/test_mega_attention_gpu.py -k "step_matches or graph or matches_reference" \
    --timeout 190 2>&1 | tail -3
  one_two_vs_old 6d2d530
  ab DSV41_Q_ROPE_IN_WQB "1 0" --backend nvidia --tp 4 --tokens 1,16,48
fi
if [ "$what" = s17b ]; then
  # Session 17, call 2 (about 6 minutes): one token's whole-row GEMV tiles of 64 KB
  # (DSV41_GEMV_TAIL=65536; 8 warps, or 16 with DSV41_GEMV_WIDE_WARPS=16): fewer programs a SM,
  # room beside them for the next kernel's; q turned by attention (DSV41_Q_ROPE_IN_WQB=0); the
  # attention trace with and without 64 KB tiles; nvidia's step test with 64 KB tiles.
  T="DSV41_GEMV_TAIL=65536" Q="DSV41_Q_ROPE_IN_WQB=0" W="DSV41_GEMV_WIDE_WARPS=16"
  for r in 1 2; do
    for sets in "" "$T" "$T $W" "$Q" "$T $Q"; do v "$sets" --backend nvidia --tp 4 --tokens 1; done
  done
  for sets in "" "$T" "$T $W" "$Q"; do v "$sets" --backend nvidia --tp 2 --tokens 1; done
  for sets in "" "$T"; do
    (if [ -n "$sets" ]; then export $sets; fi; timeout 100 python3 benchmarks/profile_step.py \
      --tp 4 --tokens 1 --attn-trace 2>&1 | tail -10 | sed "s/^/${sets:-default}: /")
  done
  DSV41_GEMV_TAIL=65536 timeout 150 python3 -m pytest -q -p no:cacheprovider \
    tests/gpu/test_nvidia_step_gpu.py -k "step_matches" --timeout 140 2>&1 | tail -3
fi
if [ "$what" = s17c ]; then
  # Session 17, call 3 (about 6 minutes): the combine reads every split's partials in one
  # load each (all in flight at once; SM90 SASS after the wait: 14 loads a thread instead of
  # 160): nvidia's step and attention GPU tests; A/B against 6afa29e (a copy in _old/, not
  # committed) at 1 and 2 tokens and at 16 and 48; the attention trace.
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_nvidia_step_gpu.py \
    tests/gpu/test_mega_attention_gpu.py -k "step_matches or matches_reference" \
    --timeout 190 2>&1 | tail -3
  one_two_vs_old 6afa29e
  vs_old 6afa29e --backend nvidia --tp 4 --tokens 16,48
  timeout 100 python3 benchmarks/profile_step.py --tp 4 --tokens 1 --attn-trace 2>&1 | tail -3
fi
if [ "$what" = s17d ]; then
  # Session 17, call 4 (about 5 minutes): the combine reads all partials at once from 32 splits
  # on (COMBINE_WIDE_SPLITS), split by split below: nvidia's step and attention GPU tests;
  # A/B against split by split everywhere (DSV41_COMBINE_WIDE=0), three times at tp 4, once at
  # tp 2, one token; nvidia's tables at both shares.
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_nvidia_step_gpu.py \
    tests/gpu/test_mega_attention_gpu.py -k "step_matches or matches_reference" \
    --timeout 190 2>&1 | tail -3
  for r in 1 2 3; do ab DSV41_COMBINE_WIDE "1 0" --backend nvidia --tp 4 --tokens 1; done
  ab DSV41_COMBINE_WIDE "1 0" --backend nvidia --tp 2 --tokens 1
  for tp in 4 2; do v "" --backend nvidia --tp $tp --tokens 1,2,4,8,16,32,48; done
fi
if [ "$what" = s17e ]; then
  # Session 17, call 5 (about 3 minutes): combine programs of 2 or 1 heads
  # (DSV41_COMBINE_HEADS; 128 or 256 programs a head tile, 4 heads and 64 by default) with the
  # all-at-once reads: attention's GPU tests at each; A/B twice at tp 4, once at tp 2, one token.
  for h in 2 1; do
    DSV41_COMBINE_HEADS=$h timeout 60 python3 -m pytest -q -p no:cacheprovider \
      tests/gpu/test_mega_attention_gpu.py -k "any_split or matches_reference" --timeout 55 2>&1 | tail -1
  done
  for r in 1 2; do ab DSV41_COMBINE_HEADS "4 2 1" --backend nvidia --tp 4 --tokens 1; done
  ab DSV41_COMBINE_HEADS "4 2 1" --backend nvidia --tp 2 --tokens 1
fi
if [ "$what" = s18 ]; then
  # Prepared in session 17 for the next (about 6 minutes, not yet run): the next kernel's launch
  # released only once a kernel's own inputs are read (DSV41_PDL_LATE: 1 one-token GEMMs, 2
  # attention, 4 the combine; sums), so its weight loads stream after those reads instead of
  # beside them: nvidia's step tests with all three late; A/B twice at tp 4, once at tp 2, one
  # token; the attention trace with all three late.
  switch_call DSV41_PDL_LATE 7 "0 4 6 7 1" "0 7"
fi
if [ "$what" = s18b ] || [ "$what" = s18c ]; then
  # Session 18, calls 2 and 3 (about 5 minutes each; the same commands on two trees, the
  # attention insert removed after them): at one and two tokens attention makes the new keys
  # and inserts their records itself (DSV41_ATTN_INSERT=1, then the default; no norm kernel,
  # no side stream, attention launched by PDL after wq_b). s18b: its key table and an L2
  # prefetch of its records before the wait; s18c: wq_b releases attention only after its own
  # PDL wait, so attention reads its one-block split's records before its wait and swaps in
  # the new keys after it. nvidia's step tests (the insert's test included) and attention's;
  # A/B against the side-stream norm kernel twice at tp 4, once at tp 2; the attention trace.
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_nvidia_step_gpu.py \
    tests/gpu/test_mega_attention_gpu.py -k "step_matches or graph or insert or matches_reference" \
    --timeout 190 2>&1 | tail -3
  for r in 1 2; do ab DSV41_ATTN_INSERT "1 0" --backend nvidia --tp 4 --tokens 1,2; done
  ab DSV41_ATTN_INSERT "1 0" --backend nvidia --tp 2 --tokens 1,2
  timeout 100 python3 benchmarks/profile_step.py --tp 4 --tokens 1 --attn-trace 2>&1 | tail -10
fi
if [ "$what" = s18d ]; then
  # Session 18, call 4 (about 6 minutes): the attention insert again, the new keys now in a
  # split of their own (the other splits skip those slots: no program does both), and wq_b's
  # programs asking the L2 for attention's records before their wait (DSV41_WQB_PREFETCH).
  # nvidia's step tests and attention's (both on, the defaults); A/B of the four combinations
  # twice at tp 4 (one and two tokens), both on and both off at tp 2; the attention trace.
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_nvidia_step_gpu.py \
    tests/gpu/test_mega_attention_gpu.py -k "step_matches or graph or insert or matches_reference" \
    --timeout 190 2>&1 | tail -3
  for r in 1 2; do
    for s in "DSV41_ATTN_INSERT=1 DSV41_WQB_PREFETCH=1" "DSV41_ATTN_INSERT=1 DSV41_WQB_PREFETCH=0" \
      "DSV41_ATTN_INSERT=0 DSV41_WQB_PREFETCH=1" "DSV41_ATTN_INSERT=0 DSV41_WQB_PREFETCH=0"; do
      v "$s" --backend nvidia --tp 4 --tokens 1,2
    done
  done
  for s in "DSV41_ATTN_INSERT=1 DSV41_WQB_PREFETCH=1" "DSV41_ATTN_INSERT=0 DSV41_WQB_PREFETCH=0"; do
    v "$s" --backend nvidia --tp 2 --tokens 1,2
  done
  timeout 100 python3 benchmarks/profile_step.py --tp 4 --tokens 1 --attn-trace 2>&1 | tail -4
fi
if [ "$what" = s18e ]; then
  # Session 18, call 5 (about 4 minutes; the attention insert removed after s18d): the final
  # tree, wq_b asking the L2 for attention's records (DSV41_WQB_PREFETCH, on): nvidia's step
  # tests; A/B once at each share, one and two tokens; nvidia's tables at both shares.
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_nvidia_step_gpu.py \
    -k "step_matches or graph" --timeout 140 2>&1 | tail -3
  for tp in 4 2; do ab DSV41_WQB_PREFETCH "1 0" --backend nvidia --tp $tp --tokens 1,2; done
  tables nvidia
fi
if [ "$what" = s19 ]; then
  # Session 19, call 1 (about 6 minutes): the one- and two-token chain's PDL edges handed off
  # through flags (DSV41_HANDOFF=1): nvidia's step tests with it; A/B twice at tp 4, once at
  # tp 2, one and two tokens; the attention trace with and without.
  DSV41_HANDOFF=1 timeout 150 python3 -m pytest -q -p no:cacheprovider \
    tests/gpu/test_nvidia_step_gpu.py -k "step_matches or graph" --timeout 140 2>&1 | tail -3
  for r in 1 2; do ab DSV41_HANDOFF "0 1" --backend nvidia --tp 4 --tokens 1,2; done
  ab DSV41_HANDOFF "0 1" --backend nvidia --tp 2 --tokens 1,2
  for s in 0 1; do
    DSV41_HANDOFF=$s timeout 100 python3 benchmarks/profile_step.py --tp 4 --tokens 1 \
      --attn-trace 2>&1 | tail -14 | sed "s/^/DSV41_HANDOFF=$s: /"
  done
fi
if [ "$what" = s19b ]; then
  # Session 19, call 2 (about 4 minutes): as s19, the flags polled by one warp a program.
  for r in 1 2; do ab DSV41_HANDOFF "0 1" --backend nvidia --tp 4 --tokens 1,2; done
  DSV41_HANDOFF=1 timeout 100 python3 benchmarks/profile_step.py --tp 4 --tokens 1 \
    --attn-trace 2>&1 | tail -10
fi
if [ "$what" = s19c ]; then
  # Session 19, call 3 (about 5 minutes): one token's whole-row tiles of 64 KB at one GEMM site
  # at a time (DSV41_GEMV_TAIL_<SITE>=65536), and bf16 attention partials
  # (DSV41_ATTN_BF16_PARTS=1), each against the defaults, twice at tp 4, M = 1; then tp 2.
  for r in 1 2; do
    for sets in "" DSV41_GEMV_TAIL_WQKV=65536 DSV41_GEMV_TAIL_WQ_B=65536 \
      DSV41_GEMV_TAIL_WO_A=65536 DSV41_GEMV_TAIL_WO_B=65536 DSV41_ATTN_BF16_PARTS=1; do
      v "$sets" --backend nvidia --tp 4 --tokens 1
    done
  done
  for sets in "" DSV41_GEMV_TAIL_WQKV=65536 DSV41_GEMV_TAIL_WO_A=65536 DSV41_ATTN_BF16_PARTS=1; do
    v "$sets" --backend nvidia --tp 2 --tokens 1
  done
fi
if [ "$what" = s20 ]; then
  # Session 20, call 1 (about 5 minutes; DSV41_GEMV_TC was removed after it, code in 32d6031):
  # one token's whole GEMV rows, 16 a program, with the
  # block sums on f16 tensor cores (DSV41_GEMV_TC: 1 every site, else the N of the sites that
  # do; tp 4: 1792 Wqkv, 8192 wq_b, 2048 wo_a, 5120 wo_b): the step tests with it on, A/B of
  # off, all and each site alone twice at tp 4, off and all at tp 2, the trace with it on.
  switch_call DSV41_GEMV_TC 1 "0 1 1792 8192 2048 5120" "0 1"
fi
if [ "$what" = s20b ]; then
  # Session 20, call 2 (about 4 minutes; DSV41_FUSE_WO_A was removed after it, code in bc6679d):
  # one token's attention combine and wo_a in one launch
  # (DSV41_FUSE_WO_A=1, combine_wo_a; z summed in fixed point, wo_b reads it): the step tests
  # with it on, A/B twice at tp 4 and once at tp 2, the trace with it on.
  switch_call DSV41_FUSE_WO_A 1 "0 1"
fi
if [ "$what" = s20c ]; then
  # Session 20, call 3 (about 3 minutes): hardware counters of each kernel of one nvidia step at
  # tp 4, M = 1 (the fifth eager step; ncu runs the kernels one at a time, caches flushed before
  # each, so no PDL overlap and no co-resident weight stream): duration, instructions executed
  # a warp, warps active, the stall reasons with >= 0.3 cycles an issue.
  M="$NCU_METRICS,launch__block_size,lts__t_bytes.sum"
  timeout 200 $NCU --clock-control none -k regex:"mx_gemm|mega_attention|norm_rope" \
    --launch-skip 28 --launch-count 7 --csv --page raw --metrics "$M" \
    python3 benchmarks/ncu_steps.py --backend nvidia > "$OUT/ncu_step.csv" 2> "$OUT/ncu_step.err"
  tail -3 "$OUT/ncu_step.err"
  python3 - "$OUT/ncu_step.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if r]
head = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
names, data = rows[head], rows[head + 2:]
col = {n: i for i, n in enumerate(names)}
def f(r, n):
    try:
        return float(r[col[n]].replace(",", ""))
    except (KeyError, ValueError):
        return float("nan")
for r in data:
    warps = f(r, "launch__grid_size") * f(r, "launch__block_size") / 32
    stalls = sorted(((f(r, n), n.split("stalled_")[1].split("_per")[0]) for n in names
                     if "issue_stalled" in n), reverse=True)
    print(f"{r[col['Kernel Name']][:28]:28s} {f(r, 'gpu__time_duration.sum') / 1e3:7.2f} us "
          f"grid {f(r, 'launch__grid_size'):5.0f} regs {f(r, 'launch__registers_per_thread'):4.0f} "
          f"inst/warp {f(r, 'smsp__inst_executed.sum') / warps:6.0f} "
          f"active {f(r, 'sm__warps_active.avg.pct_of_peak_sustained_active'):5.1f}% "
          f"dram {f(r, 'dram__bytes_read.sum') / 1e6:6.2f} MB | "
          + " ".join(f"{n} {v:.1f}" for v, n in stalls if v >= 0.3))
PY
fi
if [ "$what" = s20d ]; then
  # Session 20, call 4 (about 9 minutes; _old/ holds tree a534556): the wide combine reading the
  # splits as a power of two and the rest (40: 32 + 8, no padded rows) against one load padded
  # to 64: the attention and step GPU tests, one and two tokens against the old tree twice at
  # tp 4 and once at tp 2, then the tables of every M at both shares.
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_mega_attention_gpu.py \
    tests/gpu/test_nvidia_step_gpu.py -k "matches_reference or any_split or step_matches or graph" \
    --timeout 190 2>&1 | tail -3
  one_two_vs_old a534556
  tables nvidia
fi
if [ "$what" = s20e ]; then
  # Session 20, call 5 (about 5 minutes): every nvidia GPU test on the final tree, then the
  # combine's heads a program (DSV41_COMBINE_HEADS 4, the default, 2 and 1) with the split
  # pieces, once at tp 4, one token.
  timeout 300 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_nvidia_step_gpu.py \
    tests/gpu/test_mega_attention_gpu.py tests/gpu/test_mx_gpu.py --timeout 290 2>&1 | tail -3
  ab DSV41_COMBINE_HEADS "4 2 1" --backend nvidia --tp 4 --tokens 1
fi
if [ "$what" = s20f ]; then
  # Session 20, call 6 (about 3 minutes; DSV41_ATTN_WARPS was removed after it, code in
  # 26cbb82): attention programs of 4 (the default), 8 and 16 warps
  # (DSV41_ATTN_WARPS; 16 warps at 78 registers hold one program a SM): attention's GPU tests
  # with 16, then one token twice at tp 4 and once at tp 2.
  DSV41_ATTN_WARPS=16 timeout 90 python3 -m pytest -q -p no:cacheprovider \
    tests/gpu/test_mega_attention_gpu.py -k matches_reference --timeout 80 2>&1 | tail -2
  for r in 1 2; do ab DSV41_ATTN_WARPS "4 8 16" --backend nvidia --tp 4 --tokens 1; done
  ab DSV41_ATTN_WARPS "4 16" --backend nvidia --tp 2 --tokens 1
fi
if [ "$what" = s21 ]; then
  # Session 21, call 1 (about 7 minutes): attention's and the combine's programs holding 1 / n
  # of a SM's shared memory (DSV41_ATTN_PER_SM, DSV41_COMBINE_PER_SM = n), so no weight stream
  # of wo_a or wo_b sits beside their L2 reads: attention's and the step's GPU tests with both
  # on, A/B twice at tp 4 and once at tp 2, one token; the trace with the default and with both.
  both="DSV41_ATTN_PER_SM=1 DSV41_COMBINE_PER_SM=2"
  env $both timeout 150 python3 -m pytest -q -p no:cacheprovider \
    tests/gpu/test_mega_attention_gpu.py tests/gpu/test_nvidia_step_gpu.py \
    -k "matches_reference or step_matches or graph" --timeout 140 2>&1 | tail -3
  for r in 1 2; do
    for sets in "" DSV41_ATTN_PER_SM=1 DSV41_COMBINE_PER_SM=1 DSV41_COMBINE_PER_SM=2 "$both" \
        "DSV41_ATTN_PER_SM=1 DSV41_COMBINE_PER_SM=1"; do
      v "$sets" --backend nvidia --tp 4 --tokens 1
    done
  done
  for sets in "" DSV41_ATTN_PER_SM=1 "$both"; do v "$sets" --backend nvidia --tp 2 --tokens 1; done
  for sets in "" "$both"; do
    echo "trace: ${sets:-default}"
    (if [ -n "$sets" ]; then export $sets; fi
     timeout 100 python3 benchmarks/profile_step.py --tp 4 --tokens 1 --attn-trace 2>&1 | tail -10)
  done
fi
if [ "$what" = s21b ]; then
  # Session 21, call 2 (about 4 minutes): attention's programs alone on their SMs, 1 or 2 a SM
  # (DSV41_ATTN_PER_SM), against the default, three times at tp 4 and once at tp 2, one and two
  # tokens.
  for r in 1 2 3; do ab DSV41_ATTN_PER_SM "0 1 2" --backend nvidia --tp 4 --tokens 1,2; done
  ab DSV41_ATTN_PER_SM "0 1 2" --backend nvidia --tp 2 --tokens 1,2
fi
if [ "$what" = s21c ]; then
  # Session 21, call 3 (about 6 minutes): attention alone on its SMs by default where its launch
  # is small (tp 4, M = 1): attention's and the step's GPU tests; then, twice at tp 4, one token,
  # the default against DSV41_ATTN_ALONE=0, 8 warps an attention program (DSV41_ATTN_WARPS),
  # 8 warps with 8 score segments, and 2 heads a combine program; the trace of the default.
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_mega_attention_gpu.py \
    tests/gpu/test_nvidia_step_gpu.py -k "alone or matches_reference or step_matches or graph" \
    --timeout 190 2>&1 | tail -3
  for r in 1 2; do
    for sets in "" DSV41_ATTN_ALONE=0 DSV41_ATTN_WARPS=8 "DSV41_ATTN_WARPS=8 DSV41_ATTN_QK_SPLIT=8" \
        DSV41_COMBINE_HEADS=2; do
      v "$sets" --backend nvidia --tp 4 --tokens 1
    done
  done
  timeout 100 python3 benchmarks/profile_step.py --tp 4 --tokens 1 --attn-trace 2>&1 | tail -10
fi
if [ "$what" = s21d ]; then
  # Session 21, call 4 (about 6 minutes): attention alone, its one-block splits issuing their
  # record loads before the PDL wait and making the keys after it (the default where alone)
  # against the keys made before it (DSV41_ATTN_KEYS_AFTER_WAIT=0) and against attention not
  # alone, twice at tp 4, one token; attention's and the step's GPU tests; the tables.
  for r in 1 2; do
    for sets in "" DSV41_ATTN_KEYS_AFTER_WAIT=0 DSV41_ATTN_ALONE=0; do
      v "$sets" --backend nvidia --tp 4 --tokens 1
    done
  done
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_mega_attention_gpu.py \
    tests/gpu/test_nvidia_step_gpu.py -k "alone or matches_reference or step_matches or graph" \
    --timeout 190 2>&1 | tail -3
  tables nvidia tee
fi
if [ "$what" = s21e ]; then
  # Session 21, call 5 (about 1 minute): the one-token trace at tp 4, with attention's last
  # programs to end (which splits).
  timeout 100 python3 benchmarks/profile_step.py --tp 4 --tokens 1 --attn-trace 2>&1 | tail -12
fi
if [ "$what" = s22 ]; then
  # Session 22, call 1 (about 6 minutes): attention's tests; three rounds at tp 4, one token, of
  # this tree, this tree with the combine split by split (DSV41_COMBINE_WIDE=0) and the tree
  # before it (_old/); attention alone at tp 2, two tokens, twice; the trace.
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_mega_attention_gpu.py \
    -k "alone or matches_reference" --timeout 140 2>&1 | tail -3
  for r in 1 2 3; do
    v "" --backend nvidia --tp 4 --tokens 1
    v DSV41_COMBINE_WIDE=0 --backend nvidia --tp 4 --tokens 1
    (cd _old && export PYTHONPATH=$PWD && b --backend nvidia --tp 4 --tokens 1 | sed "s/^/HEAD: /")
  done
  for r in 1 2; do ab DSV41_ATTN_ALONE "0 1" --backend nvidia --tp 2 --tokens 2; done
  timeout 100 python3 benchmarks/profile_step.py --tp 4 --tokens 1 --attn-trace 2>&1 | tail -40
fi
if [ "$what" = s22b ]; then
  # Session 22, call 2 (about 5 minutes): the one-token trace at tp 4 by default, with PDL off
  # (no kernel's programs beside another's, no weight stream during attention) and with
  # attention not alone; attention alone against not at tp 2, one and two tokens, twice.
  for sets in "" DSV41_PDL=0 DSV41_ATTN_ALONE=0 ""; do
    echo "trace: ${sets:-default}"
    (if [ -n "$sets" ]; then export $sets; fi
     timeout 100 python3 benchmarks/profile_step.py --tp 4 --tokens 1 --attn-trace 2>&1 \
       | grep -A3 "attention and combine programs")
  done
  for r in 1 2; do ab DSV41_ATTN_ALONE "0 1" --backend nvidia --tp 2 --tokens 1,2; done
fi
if [ "$what" = s22c ]; then
  # Session 22, call 3 (about 4 minutes): the combine lets wo_a launch only N ns after its start
  # (DSV41_COMBINE_RELEASE_NS), so wo_a's weight stream runs after attention's loop, not beside
  # it: twice at tp 4, one token, N = 0 .. 4000; the trace at 2000.
  for r in 1 2; do ab DSV41_COMBINE_RELEASE_NS "0 1000 2000 3000 4000" --backend nvidia --tp 4 --tokens 1; done
  DSV41_COMBINE_RELEASE_NS=2000 timeout 100 python3 benchmarks/profile_step.py --tp 4 --tokens 1 \
    --attn-trace 2>&1 | tail -22
fi
if [ "$what" = s22d ]; then
  # Session 22, call 4 (about 10 minutes): every nvidia GPU test; attention alone (by default now
  # for two-block splits of up to 2/3 of the SMs' count of programs) against not, tp 4, M = 4
  # and tp 2, M = 2; the tables.
  timeout 300 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_nvidia_step_gpu.py \
    tests/gpu/test_mega_attention_gpu.py tests/gpu/test_mx_gpu.py --timeout 290 2>&1 | tail -3
  ab DSV41_ATTN_ALONE "0 1" --backend nvidia --tp 4 --tokens 4
  ab DSV41_ATTN_ALONE "0 1" --backend nvidia --tp 2 --tokens 2
  tables nvidia tee
fi
if [ "$what" = s22e ]; then
  # Session 22, call 5 (about 6 minutes): attention alone against not at tp 2, one and two
  # tokens, twice; the tables.
  for r in 1 2; do ab DSV41_ATTN_ALONE "0 1" --backend nvidia --tp 2 --tokens 1,2; done
  tables nvidia tee
fi
if [ "$what" = s22f ]; then
  # Session 22, call 6 (about 1 minute): with PDL off, attention's stamps in one launch and in
  # the second of two back to back (its code then in the SMs' instruction caches).
  for sets in "DSV41_PDL=0" "DSV41_PDL=0 DSV41_ATTN_TWICE=1" "DSV41_PDL=0 DSV41_ATTN_TWICE=1"; do
    echo "trace: $sets"
    (export $sets
     timeout 100 python3 benchmarks/profile_step.py --tp 4 --tokens 1 --attn-trace 2>&1 \
       | grep -A3 "attention and combine programs")
  done
fi
if [ "$what" = s22g ]; then
  # Session 22, call 7 (about 3 minutes): tp 4, one token, q read straight into the score
  # dot's segments (DSV41_ATTN_Q3D=1) against the default, three times.
  for r in 1 2 3; do ab DSV41_ATTN_Q3D "0 1" --backend nvidia --tp 4 --tokens 1; done
fi
if [ "$what" = s23 ]; then
  # Prepared for session 23 (about 2 minutes): the GPU trace tests (the stamps' order on both
  # clocks), then the one-token trace at tp 4 with each program's intervals in cycles, by
  # default and with PDL off.
  timeout 100 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_nvidia_step_gpu.py \
    -k trace --timeout 90 2>&1 | tail -3
  for sets in "" DSV41_PDL=0; do
    echo "trace: ${sets:-default}"
    (if [ -n "$sets" ]; then export $sets; fi
     timeout 100 python3 benchmarks/profile_step.py --tp 4 --tokens 1 --attn-trace 2>&1 \
       | tee "$OUT/trace-${sets:-default}.txt" | grep -A5 "attention and combine programs")
  done
  # One-token GEMV programs of 4 or 2 warps (DSV41_GEMV_WARPS: more weight bytes a thread, so
  # fewer instructions a program past the wait) against 8, three rounds at tp 4, one at tp 2.
  for r in 1 2 3; do ab DSV41_GEMV_WARPS "8 4 2" --backend nvidia --tp 4 --tokens 1; done
  ab DSV41_GEMV_WARPS "8 4 2" --backend nvidia --tp 2 --tokens 1
  for w in 4; do
    echo "gemv trace: DSV41_GEMV_WARPS=$w"
    DSV41_GEMV_WARPS=$w timeout 100 python3 benchmarks/profile_step.py --tp 4 --tokens 1 \
      --gemv-trace 2>&1 | tee "$OUT/gemv-trace-$w.txt" | tail -8
  done
fi
if [ "$what" = s23b ]; then
  # Session 23, call 2 (about 5 minutes): one-token GEMV programs of 16 warps (a shorter path a
  # warp past the wait) at every site, at wo_a and wo_b only (K 4096 / 2048 at tp 4), at Wqkv and
  # wq_b only (5120 / 1280), against 8: three rounds at tp 4, one at tp 2 (all 16); the GEMM
  # trace with 16 at every site; the step tests with it.
  for r in 1 2 3; do
    ab DSV41_GEMV_WARPS "8 16 4096=16,2048=16 5120=16,1280=16" --backend nvidia --tp 4 --tokens 1
  done
  ab DSV41_GEMV_WARPS "8 16" --backend nvidia --tp 2 --tokens 1
  trace_and_tests DSV41_GEMV_WARPS=16 --gemv-trace 12
fi
if [ "$what" = s23c ]; then
  # Session 23, call 3 (about 4 minutes): every one-token program asks the L2 for its input's
  # lines before its PDL wait (DSV41_TOUCH=1: attention q's, the GEMVs' activation; their
  # address translation then done before the wait) against not: three rounds at tp 4, M = 1,
  # one at tp 2 and at M = 2; the trace with it (attention's wait -> q loaded cycles).
  for r in 1 2 3; do ab DSV41_TOUCH "0 1" --backend nvidia --tp 4 --tokens 1; done
  ab DSV41_TOUCH "0 1" --backend nvidia --tp 2 --tokens 1
  ab DSV41_TOUCH "0 1" --backend nvidia --tp 4 --tokens 2
  DSV41_TOUCH=1 timeout 100 python3 benchmarks/profile_step.py --tp 4 --tokens 1 \
    --attn-trace 2>&1 | tail -22
fi
if [ "$what" = s23d ]; then
  # Session 23, call 4 (about 2 minutes): the attention trace with q read a second time once
  # its first read arrived, then the key table's first block (both already in the L2), by
  # default and with PDL off: the L2's latency against the first read's.
  for sets in "" DSV41_PDL=0; do
    echo "trace: ${sets:-default}"
    (if [ -n "$sets" ]; then export $sets; fi
     timeout 100 python3 benchmarks/profile_step.py --tp 4 --tokens 1 --attn-trace 2>&1 \
       | grep -A5 "attention and combine programs")
  done
fi
if [ "$what" = s23e ]; then
  # Session 23, call 5 (about 6 minutes): a one-token step writes qkv, q and z to N copies
  # (DSV41_COPIES=N), each read by a share of the next launch's programs, so hundreds of
  # programs do not all ask the same L2 lines for the same activation: N = 1 / 4 / 8 / 16 twice
  # at tp 4, 1 / 8 at tp 2; the trace with 8; the step tests with 8.
  for r in 1 2; do ab DSV41_COPIES "1 4 8 16" --backend nvidia --tp 4 --tokens 1; done
  ab DSV41_COPIES "1 8" --backend nvidia --tp 2 --tokens 1
  trace_and_tests DSV41_COPIES=8 --attn-trace 22
fi
if [ "$what" = s24 ]; then
  # Prepared for session 24 (about 8 minutes): attention reads q in the fused Q layout's memory
  # order (DSV41_ATTN_Q_LINES=1: 512 contiguous bytes a warp's read, against 32 lines a read):
  # its GPU tests, then three rounds at tp 4, M = 1, one at tp 4, M = 2 and 4 and tp 2, M = 1
  # and 2; the trace and the step tests with it (wait -> q loaded was about 2,200 cycles in
  # session 23; with the switch that stamp also takes q's permutation to [heads, dims]).
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_mega_attention_gpu.py \
    -k "q_lines or matches_reference" --timeout 140 2>&1 | tail -3
  for r in 1 2 3; do ab DSV41_ATTN_Q_LINES "0 1" --backend nvidia --tp 4 --tokens 1; done
  ab DSV41_ATTN_Q_LINES "0 1" --backend nvidia --tp 4 --tokens 2,4
  ab DSV41_ATTN_Q_LINES "0 1" --backend nvidia --tp 2 --tokens 1,2
  trace_and_tests DSV41_ATTN_Q_LINES=1 --attn-trace 22
fi
if [ "$what" = s24b ]; then
  # Session 24, call 2 (about 9 minutes): both backends read q in the fused Q layout's memory
  # order (dsv41/common/fused_layout_tl.py): the attention GPU tests; mono at tp 4, M = 1, 2, 16
  # and tp 2, M = 1 against tree 44cacc0 in _old/ (nvidia's read already in memory order, mono's
  # head by head), twice; nvidia's tables; mono's GPU tests at tp 4 (every M, the executor's
  # scratch, the graph replay) in the time left.
  timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_mega_attention_gpu.py \
    tests/common/test_fused_layout_tl.py --timeout 110 2>&1 | tail -3
  for r in 1 2; do
    vs_old 44cacc0 --backend mono --tp 4 --tokens 1,2,16
    vs_old 44cacc0 --backend mono --tp 2 --tokens 1
  done
  tables nvidia tee
  timeout 170 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_mono_gpu.py --timeout 160 \
    -k "tp4 and (every_token or scratch or graph_replay)" 2>&1 | tail -3
fi
if [ "$what" = s24c ]; then
  # Session 24, call 3 (about 4 minutes): the q-tile helper's test on the GPU (call 2 gave it
  # CPU tensors); the score dot's segments (DSV41_ATTN_QK_SPLIT, default 4 at one token) now
  # that q arrives permuted: 4 / 2 / 8 twice at tp 4, M = 1, once at tp 2, M = 1.
  timeout 60 python3 -m pytest -q -p no:cacheprovider tests/common/test_fused_layout_tl.py \
    --timeout 50 2>&1 | tail -2
  for r in 1 2; do ab DSV41_ATTN_QK_SPLIT "4 2 8" --backend nvidia --tp 4 --tokens 1; done
  ab DSV41_ATTN_QK_SPLIT "4 2 8" --backend nvidia --tp 2 --tokens 1
fi
if [ "$what" = s24d ]; then
  # Session 24, call 4 (about 7 minutes): the final tree's nvidia step tests (every M from 1 to
  # 48 and 512 against the reference, o_proj, the graph replay, the traces, both shares);
  # mono's tests at tp 2 (call 2 ran tp 4's); one bench row at tp 4, M = 1.
  timeout 220 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_nvidia_step_gpu.py \
    --timeout 210 2>&1 | tail -3
  timeout 170 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_mono_gpu.py --timeout 160 \
    -k "tp2 and (every_token or scratch or graph_replay)" 2>&1 | tail -3
  b --backend nvidia --tp 4 --tokens 1
fi
if [ "$what" = s25 ]; then
  # Prepared for session 25 (about 9 minutes): mono's tp 2 test of every M, which failed once in
  # session 24 with attention's q read in memory order (its log cut at 170 s), with the
  # head-by-head read (0, the default) and that read (1), each under a 280 s limit that prints
  # the failure; then mono at tp 4, M = 1, 2, 16 and tp 2, M = 1 with each.
  for lines in 0 1; do
    DSV41_MONO_Q_LINES=$lines timeout 290 python3 -m pytest -q -p no:cacheprovider \
      tests/gpu/test_mono_gpu.py -k "tp2 and every_token" --timeout 280 2>&1 | tail -15 \
      | sed "s/^/Q_LINES=$lines: /"
  done
  ab DSV41_MONO_Q_LINES "0 1" --backend mono --tp 4 --tokens 1,2,16
  ab DSV41_MONO_Q_LINES "0 1" --backend mono --tp 2 --tokens 1
fi
if [ "$what" = s25b ]; then
  # Session 25, call 2 (about 7 minutes): what a layer step costs against the graph's layer
  # count (the replay's own start is paid once a graph): nvidia at tp 4, M = 1 with 4 layers
  # (the default: 2.5 L2s of weights) and the model's 40, twice; tp 2, M = 1 and mono at tp 4,
  # M = 1 with each; then mono's GPU tests that call 1 and session 24 did not run with its
  # memory-order q read (the window-only layer, 300 launches, the epoch wrap; both shares).
  for n in 4 40 4 40; do
    b --backend nvidia --tp 4 --tokens 1 --layers $n | sed "s/^/layers $n: /"
  done
  for n in 4 40; do
    b --backend nvidia --tp 2 --tokens 1 --layers $n | sed "s/^/tp 2 layers $n: /"
    b --backend mono --tp 4 --tokens 1 --layers $n | sed "s/^/layers $n: /"
  done
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_mono_gpu.py \
    -k "window_only or 300 or epoch" --timeout 190 2>&1 | tail -4
fi
if [ "$what" = s25c ]; then
  # Session 26, call 3 (about 6 minutes): every mono GPU test (both shares) once mono's attention
  # reads q in the fused Q layout's memory order only.
  timeout 560 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_mono_gpu.py \
    --timeout 300 2>&1 | tail -15
fi
if [ "$what" = s26 ]; then
  # Session 26, call 1 (about 4 minutes): nvidia's tables at both shares with the bench's
  # default since session 25 (the model's 40 layers a graph), a 280 s limit a share.
  BT=280 tables nvidia tee
fi
if [ "$what" = s26b ]; then
  # mono's tables likewise (about 4 minutes; session 26's call 2 ran them inline).
  BT=280 tables mono tee
fi
if [ "$what" = s19d ]; then
  # Session 19, call 4 (about 4 minutes): wo_a's programs ask the L2 for wo_b's weights before
  # their PDL wait (DSV41_WOB_PREFETCH=1), A/B twice at tp 4 and once at tp 2, one and two
  # tokens; the GEMM and attention trace with it on.
  for r in 1 2; do ab DSV41_WOB_PREFETCH "0 1" --backend nvidia --tp 4 --tokens 1,2; done
  ab DSV41_WOB_PREFETCH "0 1" --backend nvidia --tp 2 --tokens 1,2
  DSV41_WOB_PREFETCH=1 timeout 100 python3 benchmarks/profile_step.py --tp 4 --tokens 1 \
    --attn-trace 2>&1 | tail -10
fi
if [ "$what" = s19e ]; then
  # Session 19, call 7 (about 5 minutes; DSV41_GEMV_MMA and its test were removed after it):
  # wo_a at one token on e4m3 tensor cores (DSV41_GEMV_MMA=1, gemv_mma): its GPU test, then
  # switch_call.
  timeout 60 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gemv_mma_gpu.py \
    --timeout 50 2>&1 | tail -3
  switch_call DSV41_GEMV_MMA 1 "0 1"
fi
