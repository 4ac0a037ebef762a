#!/usr/bin/env bash
# Where a decode step's GPU time goes, on a GPU machine: builds specula (Release, sm_90a), then
# for each synthetic shape times every kernel of a short `bench generate` under Nsight Compute
# (each kernel alone, cold L2) and prints one decode step's kernels by total time
# (tools/kernel_breakdown.py). SHAPES picks the models (default deepseek-v2-lite), PROMPT the
# prompt length (default 16: fewer prefill kernels to profile). Logs and CSVs to $OUT (default
# /tmp/specula-out).
set -uo pipefail
out=${OUT:-/tmp/specula-out}
mkdir -p "$out"
build=build/device
if ! cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPECULA_BUILD_BENCH=OFF \
     -DCMAKE_CUDA_ARCHITECTURES=90a >"$out/configure.log" 2>&1; then
  tail -40 "$out/configure.log"; exit 1
fi
if ! cmake --build "$build" -j "$(nproc)" --target specula_main -- -k 0 >"$out/build.log" 2>&1; then
  grep -E "error" -A4 "$out/build.log" | grep -v "^--$" | head -80; exit 1
fi
for shape in ${SHAPES:-deepseek-v2-lite}; do
  # Three decode tokens; step 1 is the first decode step after the prefill. KERNELS caps the
  # kernels profiled (the graph captures' warm-ups come first).
  timeout 300 ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base -c "${KERNELS:-3000}" \
    "$build/bin/specula" bench generate --device cuda --synthetic "$shape" --prompt-len "${PROMPT:-16}" \
    --decode-len 3 >"$out/ncu_$shape.csv" 2>"$out/ncu_$shape.err"
  echo "ncu $shape rc=$?"
  python3 tools/kernel_breakdown.py "$out/ncu_$shape.csv" --step 1 --top "${TOP:-30}"
done
