#!/usr/bin/env bash
# One GPU-machine call for the server and the hostile-input fixes: builds specula (Release,
# sm_90a) with the server (cpp-httplib bundled by tools/device/bundle_httplib.sh and carried as
# .deps), runs the CUDA model / engine / speculative tests, the hostile-input CLI script with
# speculation on the GPU, then the server against the offline engine on a synthetic Llama-3-8B:
# output tokens/s at 64 concurrent requests and time to first token at low load. Logs go to
# $OUT/logs.tar.gz; the table comes last. MEASURE_ONLY=1 builds only the binary and runs only the
# server measurements, ROUNDS times (default 1), NUM_REQUESTS requests each (default 128).
set -uo pipefail
out=${OUT:-/tmp/specula-out}
logs=$(mktemp -d)
build=build/device
export PKG_CONFIG_PATH=$PWD/.deps/httplib/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$logs/gpu.txt"
finish() {
  tar -czf "$out/logs.tar.gz" -C "$logs" .
}
trap finish EXIT
if ! cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPECULA_BUILD_BENCH=OFF \
     -DCMAKE_CUDA_ARCHITECTURES=90a >"$logs/configure.log" 2>&1; then
  tail -30 "$logs/configure.log"
  exit 1
fi
grep -E "cpp-httplib|HTTPLIB" "$logs/configure.log" | head -3
targets=""
[ "${MEASURE_ONLY:-0}" = 1 ] && targets="--target specula_main"
if ! cmake --build "$build" -j "$(nproc)" $targets -- -k 0 >"$logs/build.log" 2>&1; then
  grep -E "error" -A4 "$logs/build.log" | head -60
  exit 1
fi
bin=$build/bin/specula
if [ "${MEASURE_ONLY:-0}" != 1 ]; then
for t in cuda_model_test cuda_engine_test cuda_speculative_test; do
  "$build/tests/$t" >"$logs/$t.log" 2>&1
  echo "$t rc=$?: $(grep -E '^\[  PASSED|^\[  FAILED  \]' "$logs/$t.log" | tr '\n' ' ')"
done

# Speculation at the end of the context on the GPU (CUDA graphs on): every token, the target's own.
prompt=$(seq -s, 40 103)
for algo in none EAGLE EAGLE3; do
  flags=""
  [ "$algo" != none ] && flags="--speculative-algorithm $algo"
  "$bin" generate --device cuda --prompt-ids "$prompt" --max-new-tokens 32 --max-context-len 96 --ignore-eos --json \
    $flags >"$logs/context_end_$algo.json" 2>"$logs/context_end_$algo.err"
  echo "context end $algo: $(grep -o '"output_ids":\[[0-9,]*\]' "$logs/context_end_$algo.json" | md5sum | cut -c1-8)" \
       "tokens $(grep -o '"output_ids":\[[0-9,]*\]' "$logs/context_end_$algo.json" | tr ',' '\n' | wc -l)"
done
"$bin" generate --device cuda --prompt-ids "$prompt" --max-new-tokens 40 --max-context-len 96 --ignore-eos --json \
  --speculative-algorithm EAGLE --speculative-eagle-topk 16 --speculative-num-steps 32 \
  --speculative-num-draft-tokens 256 >"$logs/widest.json" 2>&1
echo "widest tree (32, 16, 256) at the context end: rc=$? tokens $(grep -o '"output_ids":\[[0-9,]*\]' "$logs/widest.json" | tr ',' '\n' | wc -l)"

fi

# The server against the engine in-process, synthetic Llama-3-8B, 64 at once; rounds alternate
# offline and remote so that drift on the machine falls on both.
wl="--num-requests ${NUM_REQUESTS:-128} --input-len 256 --output-len 128 --max-concurrency 64"
low="--num-requests 32 --input-len 256 --output-len 16 --max-concurrency 1"
"$bin" serve --device cuda --synthetic llama3-8b --max-running-requests 64 --port 31001 --log-level warning \
  >"$logs/serve_8b.log" 2>&1 &
server=$!
for i in $(seq 1 600); do
  grep -q "listening on" "$logs/serve_8b.log" && break
  sleep 0.5
done
runs=""
for round in $(seq 1 "${ROUNDS:-1}"); do
  # The offline engine shares the GPU with the idle server (its KV cache and weights stay
  # allocated; nothing runs on it meanwhile).
  "$bin" bench serve --device cuda --synthetic llama3-8b --max-running-requests 64 $wl \
    --json "$logs/offline_8b_$round.json" >"$logs/offline_8b_$round.log" 2>&1
  echo "offline round $round rc=$?"
  "$bin" bench serve --url http://127.0.0.1:31001 $wl --json "$logs/remote_8b_$round.json" >"$logs/remote_8b_$round.log" 2>&1
  echo "remote round $round rc=$?"
  runs="$runs offline_8b_$round remote_8b_$round"
done
# Time to first token at low load: one request at a time.
"$bin" bench serve --url http://127.0.0.1:31001 $low --json "$logs/remote_8b_low.json" >"$logs/remote_8b_low.log" 2>&1
kill -TERM $server
wait $server
echo "server exit $?"
"$bin" bench serve --device cuda --synthetic llama3-8b --max-running-requests 64 $low \
  --json "$logs/offline_8b_low.json" >"$logs/offline_8b_low.log" 2>&1

echo "== table =="
for f in $runs offline_8b_low remote_8b_low; do
  echo "$f: $(grep -E 'output tokens/s|TTFT ms|ITL ms|failed' "$logs/$f.log" | tr -s ' ' | tr '\n' ' ')"
done
