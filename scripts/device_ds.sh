#!/usr/bin/env bash
# Issue 55 on a GPU machine: builds (Release, sm_90a); runs the double-sparsity and vision tests;
# `bench attention --double-sparsity` (dense vs sparse decode of one cache); the channel config
# of the shipped model from calibration text (tools/ds_channel_config.py, PyTorch); and `bench
# perplexity` on the validation text, dense and double sparse. Text: CALIB and VAL (default
# .corpus/calib.txt and .corpus/val.txt, made from tools/corpus/build_corpus.py's output; carry
# .corpus). SKIP_TESTS=1, SKIP_BENCH=1, SKIP_PPL=1 leave parts out; PROFILE=1 adds each sparse-decode
# kernel's time under Nsight Compute. Logs to $OUT.
set -uo pipefail
out=${OUT:-/tmp/specula-out}
mkdir -p "$out"
build=build/device
if ! cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPECULA_BUILD_BENCH=OFF \
     -DCMAKE_CUDA_ARCHITECTURES=90a >"$out/configure.log" 2>&1; then
  tail -40 "$out/configure.log"; exit 1
fi
if ! cmake --build "$build" -j "$(nproc)" --target specula_main cuda_attention_test cuda_model_test -- -k 0 \
     >"$out/build.log" 2>&1; then
  grep -E "error" -A4 "$out/build.log" | grep -v "^--$" | head -80; exit 1
fi
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout 300 "$build/tests/cuda_attention_test" --gtest_filter='*DoubleSparsity*' >"$out/ds_test.log" 2>&1
  echo "cuda_attention_test (double sparsity) rc=$?"
  grep -E "^\[  (FAILED|PASSED) |^\[       OK|Failure|Expected|actual|Which|seed" "$out/ds_test.log" | head -40
  timeout 200 "$build/tests/cuda_model_test" --gtest_filter='*Vision*' >"$out/vision_test.log" 2>&1
  echo "cuda_model_test (vision) rc=$?"
  grep -E "^\[  (FAILED|PASSED) |^\[       OK|Failure|Expected|actual|Which" "$out/vision_test.log" | head -20
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  timeout 300 "$build/bin/specula" bench attention --device cuda --double-sparsity --json "$out/bench_ds.json" \
    >"$out/bench_ds.log" 2>&1
  echo "bench attention --double-sparsity rc=$?"; cat "$out/bench_ds.log"
fi
if [ -n "${PROFILE:-}" ]; then
  # Each sparse-decode kernel's time (Nsight Compute: base clocks, L2 flushed) at batch 1 and 32.
  ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  for filter in "B=1 L=32768 p16" "B=32"; do
    timeout 120 "$ncu" --kernel-name regex:'select_kernel|sparse_attention_kernel' --launch-skip 9 --launch-count 4 \
      --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__registers_per_thread \
      "$build/bin/specula" bench attention --device cuda --double-sparsity --filter "$filter" >"$out/ncu.log" 2>&1
    echo "ncu ($filter):"
    grep -E "select_kernel|sparse_attention_kernel|gpu__time|dram__|registers" "$out/ncu.log" | sed -E 's/\(SparseDecode.*//'
  done
fi
[ "${SKIP_PPL:-0}" = 1 ] && exit 0
calib=${CALIB:-.corpus/calib.txt}
val=${VAL:-.corpus/val.txt}
timeout 300 python3 tools/ds_channel_config.py --model models/specula-byte-6m --text "$calib" \
  --out "$out/ds_channels.json" --samples 64 >"$out/calibrate.log" 2>&1
echo "ds_channel_config rc=$?"; tail -3 "$out/calibrate.log"
ppl() {  # name flags...
  local name=$1; shift
  timeout 120 "$build/bin/specula" bench perplexity --device cuda --text "$val" --windows 32 --max-context-len 1024 \
    --json "$out/ppl_$name.json" "$@" >"$out/ppl_$name.log" 2>&1
  printf "%-24s %s\n" "$name" "$(grep -E 'mean loss|context >=|error' "$out/ppl_$name.log" | tr -s ' ' | tr '\n' ' ')"
}
ppl dense
for spec in "16 64 qk" "16 128 qk" "32 64 qk" "16 64 k" "8 64 qk"; do
  set -- $spec
  ppl "ds_c$1_t$2_$3" --enable-double-sparsity --ds-channel-config-path "$out/ds_channels.json" \
    --ds-heavy-channel-num "$1" --ds-heavy-token-num "$2" --ds-heavy-channel-type "$3" --ds-sparse-decode-threshold 256
done
