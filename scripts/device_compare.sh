#!/usr/bin/env bash
# Issue 49's GPU check: the refactored tree against the commit before it, side by side on one
# GPU machine in one sitting. PHASE=build builds both (this tree in build/device with every test;
# the base, extracted from .deps/base.tar by `git archive`, in build/base: specula only).
# PHASE=run runs every CUDA test binary of this tree, then the benchmarks alternating base and
# new (attention, bench generate on synthetic Llama-3-8B, bench serve with EAGLE-3 on the shipped
# pair at batch 1, 8, 32), ROUNDS times; a table comes last. SKIP_TESTS=1 / SKIP_BENCH=1 leave
# out either half. Logs go to $OUT/logs.tar.gz.
set -uo pipefail
out=${OUT:-/tmp/specula-out}
mkdir -p "$out"
logs=$(mktemp -d)
trap 'tar -czf "$out/logs.tar.gz" -C "$logs" .' EXIT
cfg="-G Ninja -DCMAKE_BUILD_TYPE=Release -DSPECULA_BUILD_BENCH=OFF -DCMAKE_CUDA_ARCHITECTURES=90a"
if [ "${PHASE:-run}" = build ]; then
  mkdir -p build/base-src && tar -xf .deps/base.tar -C build/base-src
  cmake -S . -B build/device $cfg >"$logs/configure.log" 2>&1 || { tail -30 "$logs/configure.log"; exit 1; }
  cmake -S build/base-src -B build/base $cfg -DSPECULA_BUILD_TESTS=OFF >"$logs/configure_base.log" 2>&1 ||
    { tail -30 "$logs/configure_base.log"; exit 1; }
  cmake --build build/base -j 6 --target specula_main >"$logs/build_base.log" 2>&1 &
  base_pid=$!
  cmake --build build/device -j 12 -- -k 0 >"$logs/build.log" 2>&1
  rc=$?
  wait $base_pid
  base_rc=$?
  echo "build rc=$rc base rc=$base_rc"
  grep -E "error" -A4 "$logs/build.log" "$logs/build_base.log" | head -60
  exit $((rc || base_rc))
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
# Whatever changed since the build phase (the tree travels again with each call).
cmake --build build/device -j 16 -- -k 0 >"$logs/rebuild.log" 2>&1 || { grep -E "error" -A4 "$logs/rebuild.log" | head -40; exit 1; }
failed=0
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  for t in cuda_core_test cuda_kv_test cuda_attention_test cuda_mla_test cuda_model_test cuda_engine_test \
           cuda_speculative_test; do
    timeout 400 "build/device/tests/$t" >"$logs/$t.log" 2>&1
    t_rc=$?
    [ $t_rc = 0 ] || failed=1
    echo "$t rc=$t_rc: $(grep -E '^\[  PASSED|^\[  FAILED  \]' "$logs/$t.log" | head -8 | tr '\n' ' ')"
  done
fi
[ "${SKIP_BENCH:-0}" = 1 ] && exit $failed
new=build/device/bin/specula
base=build/base/bin/specula
# The shipped pair's paths are relative to this tree, so both binaries run from here.
row() {  # name log
  printf "%-34s %s\n" "$1" "$(grep -E "$2" "$3" | tr -s ' ' | head -3 | tr '\n' ' ')"
}
for r in $(seq 1 "${ROUNDS:-2}"); do
  for side in base new; do
    bin=${!side}
    for f in "decode B=64 L=4096 p16" "prefill causal hd128"; do
      "$bin" bench attention --device cuda --filter "$f" >"$logs/attn_${side}_$r.log" 2>&1
      row "attention ${f%% *} $side r$r" "$f" "$logs/attn_${side}_$r.log"
    done
    timeout 300 "$bin" bench generate --device cuda --synthetic llama3-8b --prompt-len 256 --decode-len 64 \
      >"$logs/gen8b_${side}_$r.log" 2>&1
    row "generate 8b $side r$r" "decode|tokens/s" "$logs/gen8b_${side}_$r.log"
    for bs in 1 8 32; do
      "$bin" bench serve --device cuda --model models/specula-byte-6m --dataset text --num-requests $((bs * 4 < 16 ? 16 : bs * 4)) \
        --max-running-requests "$bs" --input-len 128 --output-len 256 --max-context-len 1024 \
        --speculative-algorithm EAGLE3 --draft-model models/specula-byte-6m-eagle3 \
        >"$logs/serve_${side}_bs${bs}_$r.log" 2>&1
      row "serve EAGLE3 bs$bs $side r$r" "output tokens/s|mean accept" "$logs/serve_${side}_bs${bs}_$r.log"
    done
  done
done | tee "$logs/table.txt"
exit $failed
