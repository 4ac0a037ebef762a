#!/usr/bin/env bash
# Builds specula on a GPU machine (Release, sm_90a) and runs, in order: the CUDA attention, model
# and engine tests, generate on the GPU, the generation / serving / attention benchmarks against
# the device's measured ceilings, and compute-sanitizer memcheck over the CUDA tests. Logs and
# JSON go to $OUT (default /tmp/specula-out); a summary and the benchmark tables follow, and the
# optional ncu counters (NCU=1, NCU_GEMV=1) come last. SKIP_ATTENTION=1 skips the attention
# tests, benchmark and memcheck.
set -uo pipefail
out=${OUT:-/tmp/specula-out}
mkdir -p "$out"
build=build/device

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
if ! cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPECULA_BUILD_BENCH=OFF \
     -DCMAKE_CUDA_ARCHITECTURES=90a >"$out/configure.log" 2>&1; then
  tail -40 "$out/configure.log"
  exit 1
fi
if ! cmake --build "$build" -j "$(nproc)" -- -k 0 >"$out/build.log" 2>&1; then
  grep -E "error" -A4 "$out/build.log" | grep -v "^--$" | head -120
  exit 1
fi

attention=$([ "${SKIP_ATTENTION:-0}" = 1 ] && echo ":" || echo "")
$attention "$build/tests/cuda_attention_test" ${GTEST_FILTER:+--gtest_filter=$GTEST_FILTER} >"$out/cuda_test.log" 2>&1
test_rc=$?
grep -E "^\[  (FAILED|PASSED) |Failure|error|seed=" "$out/cuda_test.log" | head -60

"$build/tests/cuda_model_test" >"$out/cuda_model_test.log" 2>&1
model_rc=$?
grep -E "^\[  (FAILED|PASSED) |Failure|Expected|Which|max_diff|step" "$out/cuda_model_test.log" | head -30
"$build/tests/cuda_engine_test" >"$out/cuda_engine_test.log" 2>&1
engine_rc=$?
grep -E "^\[  (FAILED|PASSED) |Failure|Expected|Which|retract" "$out/cuda_engine_test.log" | head -30
"$build/tests/cuda_speculative_test" >"$out/cuda_speculative_test.log" 2>&1
spec_rc=$?
grep -E "^\[  (FAILED|PASSED) |Failure|Expected|Which|mean accept" "$out/cuda_speculative_test.log" | head -30
"$build/bin/specula" generate --device cuda --prompt "The quick brown fox" --max-new-tokens 48 >"$out/generate.log" 2>&1
"$build/bin/specula" generate --device cuda --prompt "The quick brown fox" --max-new-tokens 48 \
  --speculative-algorithm EAGLE3 >"$out/generate_spec.log" 2>&1
# Speculative decoding against plain decoding (CUDA graphs on) on the shipped pair, natural text.
for bs in 1 8 32; do
  for spec in none EAGLE3 EAGLE; do
    flags=""
    [ "$spec" != none ] && flags="--speculative-algorithm $spec --draft-model models/specula-byte-6m-$(echo $spec | tr A-Z a-z)"
    "$build/bin/specula" bench serve --device cuda --model models/specula-byte-6m --dataset text \
      --num-requests $((bs * 4)) --max-running-requests $bs --input-len 128 --output-len 256 $flags \
      --json "$out/spec_${spec}_bs$bs.json" >"$out/spec_${spec}_bs$bs.log" 2>&1
    echo "spec=$spec bs=$bs: $(grep -E 'output tokens/s|mean accept' "$out/spec_${spec}_bs$bs.log" | tr -s ' ' | tr '\n' ' ')"
  done
done | tee "$out/spec_table.txt"
"$build/bin/specula" bench generate --device cuda --synthetic llama3.2-1b --prompt-len 256 --decode-len 32 \
  >"$out/bench_generate.log" 2>&1
"$build/bin/specula" bench generate --device cuda --model models/specula-byte-6m --prompt-len 128 --decode-len 256 \
  >"$out/bench_generate_small.log" 2>&1
timeout 300 "$build/bin/specula" bench generate --device cuda --synthetic llama3-8b --prompt-len 256 --decode-len 64 \
  >"$out/bench_generate_8b.log" 2>&1
timeout 300 "$build/bin/specula" bench serve --device cuda --synthetic llama3-8b --num-requests 128 \
  --max-running-requests 64 --input-len 256 --output-len 128 --json "$out/serve_8b_bs64.json" \
  >"$out/bench_serve_8b_bs64.log" 2>&1
for bs in 1 64; do
  "$build/bin/specula" bench serve --device cuda --synthetic llama3.2-1b --num-requests $((bs * 2)) \
    --max-running-requests $bs --input-len 256 --output-len 128 --json "$out/serve_1b_bs$bs.json" \
    >"$out/bench_serve_1b_bs$bs.log" 2>&1
done
$attention "$build/bin/specula" bench attention --device cuda --json "$out/bench.json" >"$out/bench.log" 2>&1
bench_rc=$?

$attention timeout "${MEMCHECK_SECONDS:-240}" compute-sanitizer --tool memcheck --error-exitcode 9 \
  "$build/tests/cuda_attention_test" --gtest_brief=1 >"$out/memcheck.log" 2>&1
memcheck_rc=$?
timeout "${MEMCHECK_SECONDS:-240}" compute-sanitizer --tool memcheck --error-exitcode 9 \
  "$build/tests/cuda_engine_test" --gtest_brief=1 >"$out/memcheck_engine.log" 2>&1
memcheck_engine_rc=$?

echo "== summary =="
echo "cuda_attention_test rc=$test_rc: $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test' "$out/cuda_test.log" | tr '\n' ' ')"
echo "cuda_model_test rc=$model_rc: $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test' "$out/cuda_model_test.log" | tr '\n' ' ')"
echo "cuda_engine_test rc=$engine_rc: $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test' "$out/cuda_engine_test.log" | tr '\n' ' ')"
echo "cuda_speculative_test rc=$spec_rc: $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test' "$out/cuda_speculative_test.log" | tr '\n' ' ')"
echo "generate --device cuda: $(tr '\n' ' ' < "$out/generate.log")"
echo "generate --device cuda EAGLE3: $(tr '\n' ' ' < "$out/generate_spec.log")"
cat "$out/spec_table.txt"
echo "memcheck rc=$memcheck_rc (124 = timed out): $(grep -E 'ERROR SUMMARY' "$out/memcheck.log" | tail -1)"
echo "memcheck engine rc=$memcheck_engine_rc: $(grep -E 'ERROR SUMMARY' "$out/memcheck_engine.log" | tail -1)"
echo "bench rc=$bench_rc"
cat "$out/bench_generate.log" "$out/bench_generate_small.log" "$out/bench_generate_8b.log" "$out/bench_serve_8b_bs64.log" "$out/bench_serve_1b_bs1.log" "$out/bench_serve_1b_bs64.log"
cat "$out/bench.log"

# Optional: hardware counters of one decode and one prefill launch (NCU=1).
if [ "${NCU:-0}" = 1 ] && command -v ncu >/dev/null; then
  timeout 200 ncu --clock-control none --section SpeedOfLight --section Occupancy --section MemoryWorkloadAnalysis \
    -k regex:decode_kernel -c 1 "$build/bin/specula" bench attention --device cuda --filter "decode B=64 L=4096 p16" \
    >"$out/ncu_decode.log" 2>&1
  timeout 200 ncu --clock-control none --section SpeedOfLight --section Occupancy \
    -k regex:prefill_kernel -c 1 "$build/bin/specula" bench attention --device cuda --filter "prefill causal hd128" \
    >"$out/ncu_prefill.log" 2>&1
  grep -E "Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Duration|L1/TEX Hit|L2 Hit" \
    "$out/ncu_decode.log" "$out/ncu_prefill.log" | head -60
fi

# Optional: hardware counters of the decode GEMV on the Llama-3-8B shape (NCU_GEMV=1).
if [ "${NCU_GEMV:-0}" = 1 ] && command -v ncu >/dev/null; then
  timeout 300 ncu --clock-control none --section SpeedOfLight --section Occupancy --section MemoryWorkloadAnalysis \
    -k regex:gemv_kernel -s 8 -c 4 "$build/bin/specula" bench generate --device cuda --synthetic llama3-8b \
    --prompt-len 16 --decode-len 4 >"$out/ncu_gemv.log" 2>&1
  grep -E "gemv_kernel|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit" \
    "$out/ncu_gemv.log" | head -60
fi
