#!/usr/bin/env bash
# Speculative decoding on a GPU machine: builds (Release, sm_90a), runs the CUDA speculative tests,
# then the serving benchmark on the shipped pair with natural text, plain decoding against EAGLE-3
# and EAGLE at batch 1, 8 and 32 (CUDA graphs on everywhere), and prints one table. Logs and JSON
# go to $OUT (default /tmp/specula-out). SPEC_CONFIGS overrides the (steps,topk,draft) list.
set -uo pipefail
out=${OUT:-/tmp/specula-out}
mkdir -p "$out"
build=build/device
if ! cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPECULA_BUILD_BENCH=OFF \
     -DCMAKE_CUDA_ARCHITECTURES=90a >"$out/configure.log" 2>&1; then
  tail -40 "$out/configure.log"; exit 1
fi
if ! cmake --build "$build" -j "$(nproc)" -- -k 0 >"$out/build.log" 2>&1; then
  grep -E "error" -A4 "$out/build.log" | grep -v "^--$" | head -80; exit 1
fi
"$build/tests/cuda_speculative_test" ${GTEST_FILTER:+--gtest_filter=$GTEST_FILTER} >"$out/cuda_speculative_test.log" 2>&1
echo "cuda_speculative_test rc=$?"
grep -E "^\[  (FAILED|PASSED) |Failure|Expected|Which|mean accept|seed" "$out/cuda_speculative_test.log" | head -40
configs=${SPEC_CONFIGS:-"5,4,8 6,8,32"}
bench() {  # name bs flags...
  local name=$1 bs=$2; shift 2
  "$build/bin/specula" bench serve --device cuda --model models/specula-byte-6m --dataset text \
    --num-requests $((bs * 4)) --max-running-requests "$bs" --input-len 128 --output-len 256 "$@" \
    --json "$out/spec_${name}_bs$bs.json" >"$out/spec_${name}_bs$bs.log" 2>&1
  printf "%-22s bs=%-3s %s\n" "$name" "$bs" "$(grep -E 'output tokens/s|decode tokens/s|mean accept|per cycle' "$out/spec_${name}_bs$bs.log" | tr -s ' ' | tr '\n' ' ')"
}
for bs in ${SPEC_BATCHES:-1 8 32}; do
  bench plain "$bs"
  for c in $configs; do
    IFS=, read -r s k n <<<"$c"
    for algo in ${SPEC_ALGOS:-EAGLE3 EAGLE}; do
      bench "${algo}_$s-$k-$n" "$bs" --speculative-algorithm "$algo" \
        --draft-model "models/specula-byte-6m-$(echo "$algo" | tr A-Z a-z)" \
        --speculative-num-steps "$s" --speculative-eagle-topk "$k" --speculative-num-draft-tokens "$n"
    done
  done
done | tee "$out/spec_table.txt"
