#!/usr/bin/env bash
# Mixture-of-experts on a GPU machine: builds (Release, sm_90a), runs cuda_model_test (the MoE
# kernels and layers against the CPU, the DeepSeek MoE models against the float64 reference, and
# every other GPU model test, since the decoder layers changed), then `bench moe` (decode
# bandwidth and prefill GEMM rate of the layer), `bench generate` (batch 1 decode of the whole
# model) and `bench serve` (batch 1 and 64) on the synthetic DeepSeek-V2-Lite and Qwen3-30B-A3B.
# SKIP_TESTS=1 leaves out the tests, SKIP_SERVE=1 the serving runs, SHAPES picks the models.
# PROFILE=1 adds, per shape, one decode step's kernels by GPU time under Nsight Compute (each
# kernel alone, cold L2; tools/kernel_breakdown.py). Logs to $OUT (default
# /tmp/specula-out).
set -uo pipefail
out=${OUT:-/tmp/specula-out}
mkdir -p "$out"
build=build/device
if ! cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPECULA_BUILD_BENCH=OFF \
     -DCMAKE_CUDA_ARCHITECTURES=90a >"$out/configure.log" 2>&1; then
  tail -40 "$out/configure.log"; exit 1
fi
if ! cmake --build "$build" -j "$(nproc)" --target specula_main cuda_model_test -- -k 0 >"$out/build.log" 2>&1; then
  grep -E "error" -A4 "$out/build.log" | grep -v "^--$" | head -80; exit 1
fi
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout 400 "$build/tests/cuda_model_test" ${GTEST_FILTER:+--gtest_filter=$GTEST_FILTER} >"$out/cuda_model_test.log" 2>&1
  echo "cuda_model_test rc=$?"
  grep -E "^\[  (FAILED|PASSED) |Failure|Expected|Which|compared|checked|max error" "$out/cuda_model_test.log" | head -60
fi
[ "${SKIP_BENCH:-0}" = 1 ] && exit 0
timeout 300 "$build/bin/specula" bench moe --json "$out/bench_moe.json" >"$out/bench_moe.log" 2>&1
echo "bench moe rc=$?"; cat "$out/bench_moe.log"
for shape in ${SHAPES:-deepseek-v2-lite qwen3-30b-a3b}; do
  timeout 300 "$build/bin/specula" bench generate --device cuda --synthetic "$shape" --prompt-len 128 --decode-len 128 \
    --json "$out/generate_$shape.json" >"$out/generate_$shape.log" 2>&1
  echo "bench generate $shape rc=$?"; tail -8 "$out/generate_$shape.log"
  [ "${SKIP_SERVE:-0}" = 1 ] && continue
  for bs in ${BATCHES:-1 64}; do
    timeout 300 "$build/bin/specula" bench serve --device cuda --synthetic "$shape" --num-requests $((bs * 3)) \
      --max-running-requests "$bs" --input-len 128 --output-len 128 --max-context-len 512 \
      --json "$out/serve_${shape}_bs$bs.json" >"$out/serve_${shape}_bs$bs.log" 2>&1
    printf "serve %-18s bs=%-3s rc=%s %s\n" "$shape" "$bs" "$?" "$(grep -E 'output tokens/s|decode tokens/s|ITL ms|error' "$out/serve_${shape}_bs$bs.log" | tr -s ' ' | tr '\n' ' ')"
  done
done
if [ "${PROFILE:-0}" = 1 ]; then
  for shape in ${SHAPES:-deepseek-v2-lite qwen3-30b-a3b}; do
    # A 16-token prompt and three decode tokens; step 1 is the first decode step after the prefill.
    timeout 300 ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base -c 3000 \
      "$build/bin/specula" bench generate --device cuda --synthetic "$shape" --prompt-len 16 --decode-len 3 \
      >"$out/ncu_$shape.csv" 2>"$out/ncu_$shape.err"
    echo "ncu $shape rc=$?"
    python3 tools/kernel_breakdown.py "$out/ncu_$shape.csv" --step 1 --top 30
  done
fi
