#!/usr/bin/env bash
# Dual chunk attention (issue 55) and the attention peers (issue 54) on a GPU machine: builds
# (Release, sm_90a); runs the dual chunk CUDA tests (decode, prefill / extend / mixed, the sparse
# pattern's selection and prefill, the step plan), the q/k/v epilogue's and the tiny models' GPU
# tests, and compute-sanitizer memcheck over the dual chunk tests; then `bench attention --device
# cuda` on Qwen2.5-7B-1M's shape (FILTER, default qwen2.5-7b-1m: decode, dense and sparse prefill,
# the three-pass extend, beside plain attention) and, when PyTorch is there, tools/attention_peer.py
# on the same GPU (PEER_FILTER, default: every shape). SKIP_TESTS=1, SKIP_BENCH=1, SKIP_PEER=1 leave
# parts out. Logs go to $OUT/dca_logs.tgz (default /tmp/specula-out); the tables are printed last.
set -uo pipefail
final=${OUT:-/tmp/specula-out}
mkdir -p "$final"
out=$(mktemp -d)
trap 'tar -czf "$final/dca_logs.tgz" -C "$out" . && rm -rf "$out"' EXIT
build=build/device
if ! cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPECULA_BUILD_BENCH=OFF \
     -DCMAKE_CUDA_ARCHITECTURES=90a >"$out/configure.log" 2>&1; then
  tail -40 "$out/configure.log"; exit 1
fi
if ! cmake --build "$build" -j "$(nproc)" --target specula_main cuda_attention_test cuda_model_test model_test -- -k 0 \
     >"$out/build.log" 2>&1; then
  grep -E "error" -A4 "$out/build.log" | grep -v "^--$" | head -80; exit 1
fi
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  run_test() {  # log binary filter
    local log=$1 bin=$2 filter=$3
    timeout 300 env -u GTEST_FILTER "$build/tests/$bin" --gtest_filter="$filter" >"$out/$log.log" 2>&1
    echo "$bin ($filter) rc=$?"
    grep -E "^\[  (FAILED|PASSED) |^\[       OK|Failure|Expected|actual|Which|seed=" "$out/$log.log" | head -40
  }
  run_test dca cuda_attention_test '*DualChunk*'
  run_test epilogue cuda_model_test '*QkvEpilogue*'
  run_test arch model_test '*OnTheGpu*'
  timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$build/tests/cuda_attention_test" \
    --gtest_filter='*DualChunk*' --gtest_brief=1 >"$out/memcheck.log" 2>&1
  echo "memcheck rc=$? $(grep -E 'ERROR SUMMARY' "$out/memcheck.log")"
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  timeout 400 "$build/bin/specula" bench attention --device cuda --filter "${FILTER:-qwen2.5-7b-1m}" \
    --json "$out/bench_dca.json" >"$out/bench_dca.log" 2>&1
  echo "bench attention rc=$?"
fi
if [ "${SKIP_PEER:-0}" != 1 ] && python3 -c "import torch" 2>/dev/null; then
  timeout 400 python3 tools/attention_peer.py --filter "${PEER_FILTER:-}" --json "$out/peer.json" >"$out/peer.log" 2>&1
  echo "attention_peer rc=$?"
fi
[ -f "$out/bench_dca.log" ] && tail -16 "$out/bench_dca.log"
[ -f "$out/peer.log" ] && cat "$out/peer.log"
exit 0
