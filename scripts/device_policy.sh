#!/usr/bin/env bash
# The speculative policy on a GPU machine (issue 50). Builds (Release, sm_90a) the CLI and the CUDA
# test binaries, then by PHASE:
#   check: the CUDA speculative, engine and model tests, and `bench spec-cost --synthetic
#          llama3-8b` (the synthetic EAGLE-3 head of the published 8B head's shape);
#   serve: `bench serve` on the shipped pair, plain decoding against EAGLE-3 with the fixed
#          (7, 1, 8) shape and with the auto policy, at each batch of BATCHES, ROUNDS times,
#          each run sized to last about 3 s or more of plain decoding; one table at the end.
#          VARIANTS picks the runs (default "plain fixed auto"); fixed_gN / auto_gN add
#          `--speculative-admission-group N` (1: admit as rows free; 0: measured groups).
# Logs go to $OUT (default /tmp/specula-out), packed into one tar.
set -uo pipefail
out=${OUT:-/tmp/specula-out}
logs=$out/logs
mkdir -p "$logs"
build=build/device
phase=${PHASE:-check}
if ! cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPECULA_BUILD_BENCH=OFF \
     -DCMAKE_CUDA_ARCHITECTURES=90a >"$logs/configure.log" 2>&1; then
  tail -40 "$logs/configure.log"; exit 1
fi
targets="specula_main"
[ "$phase" = check ] && targets="$targets ${TESTS:-cuda_speculative_test cuda_engine_test cuda_model_test}"
if ! cmake --build "$build" -j "$(nproc)" --target $targets -- -k 0 >"$logs/build.log" 2>&1; then
  grep -E "error" -A4 "$logs/build.log" | grep -v "^--$" | head -80; exit 1
fi
bin=$build/bin/specula

if [ "$phase" = check ]; then
  for t in ${TESTS:-cuda_speculative_test cuda_engine_test cuda_model_test}; do
    filter_var="FILTER_$t"
    "$build/tests/$t" ${!filter_var:+--gtest_filter=${!filter_var}} >"$logs/$t.log" 2>&1
    echo "$t rc=$? $(grep -cE '^\[       OK \]' "$logs/$t.log") ok, $(grep -cE '^\[  FAILED  \]' "$logs/$t.log") failed lines"
    grep -E "^\[  FAILED  \]|Failure|Expected|Which|actual|auto \(|mean accept" "$logs/$t.log" | head -40
  done
  [ -n "${SKIP_SPEC_COST:-}" ] || timeout 420 "$bin" bench spec-cost --synthetic llama3-8b --context-len "${CONTEXT:-512}" \
    --json "$logs/spec_cost.json" >"$logs/spec_cost.log" 2>&1
  echo "spec-cost rc=$?"
  tail -30 "$logs/spec_cost.log"
  # Where a batch-1 cycle's time goes, kernel by kernel, when Nsight Systems is installed.
  nsys=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
  if [ -n "$nsys" ] && [ -n "${PROFILE:-}" ]; then
    timeout 300 "$nsys" profile -o "$logs/spec_bs1" --force-overwrite true --trace cuda \
      "$bin" bench spec-cost --synthetic llama3-8b --batch-sizes 1 --repeats 30 --speculative-policy fixed >"$logs/nsys_run.log" 2>&1
    "$nsys" stats --report cuda_gpu_kern_sum --format csv "$logs/spec_bs1.nsys-rep" >"$logs/kern_sum.csv" 2>"$logs/nsys_stats.log"
    echo "kernels by total time (top 25):"; head -26 "$logs/kern_sum.csv" | cut -c1-220
    rm -f "$logs/spec_bs1.nsys-rep" "$logs/spec_bs1.sqlite"
  else
    echo "nsys: ${nsys:-not found}"
  fi
fi

if [ "$phase" = serve ]; then
  # Plain output tok/s of the shipped model by batch (issue 50's table), to size runs of ~3.5 s.
  declare -A rate=([1]=6300 [2]=11000 [4]=18000 [8]=27500 [16]=48000 [32]=77000 [64]=112000)
  bench() {  # name round bs flags...
    local name=$1 round=$2 bs=$3; shift 3
    local r=${rate[$bs]:-$((bs * 2000))}
    local n=$(( r * 35 / 10 / 256 )); [ "$n" -lt $((4 * bs)) ] && n=$((4 * bs)); [ "$n" -lt 16 ] && n=16
    local log="$logs/${name}_bs${bs}_r${round}.log"
    "$bin" bench serve --device cuda --model models/specula-byte-6m --dataset text --num-requests "$n" \
      --max-running-requests "$bs" --input-len 128 --output-len 256 --max-context-len 1024 "$@" \
      --json "$logs/${name}_bs${bs}_r${round}.json" >"$log" 2>&1
    local tps acc pol pre def
    tps=$(grep -E '^output tokens/s' "$log" | awk '{print $NF}')
    acc=$(grep -E '^mean accept length' "$log" | awk '{print $NF}')
    pre=$(grep -E '^prefill-only steps' "$log" | awk '{print $(NF-1) $NF}')
    def=$(grep -E '^admission deferred steps' "$log" | awk '{print $NF}')
    pol=$(grep -E '^policy (auto|fixed) at batch' "$log" | sed -E 's/^policy [a-z]+ at batch <= ([0-9]+) +/b\1: /' | tr '\n' ';' | tr -s ' ')
    printf "%-9s r%s bs=%-3s n=%-5s out_tok_s=%-10s accept=%-6s prefill=%-14s deferred=%-5s %s\n" "$name" "$round" \
      "$bs" "$n" "$tps" "$acc" "$pre" "${def:-0}" "$pol"
  }
  spec="--speculative-algorithm EAGLE3 --draft-model models/specula-byte-6m-eagle3 --speculative-num-steps 7 \
--speculative-eagle-topk 1 --speculative-num-draft-tokens 8"
  for round in $(seq 1 "${ROUNDS:-2}"); do
    for bs in ${BATCHES:-1 2 4 8 16 32 64}; do
      for v in ${VARIANTS:-plain fixed auto}; do
        case $v in
          plain) bench plain "$round" "$bs" ;;
          # shellcheck disable=SC2086
          fixed | auto) bench "$v" "$round" "$bs" $spec --speculative-policy "$v" ;;
          # shellcheck disable=SC2086
          fixed_g* | auto_g*) bench "$v" "$round" "$bs" $spec --speculative-policy "${v%_g*}" \
            --speculative-admission-group "${v##*_g}" ;;
          *) echo "VARIANTS: unknown run $v (plain, fixed, auto, fixed_gN, auto_gN)" >&2 ;;
        esac
      done
    done
  done | tee "$logs/serve_table.txt"
  # What the auto runs' last choices rested on (bench serve prints it at the end of each run).
  for f in "$logs"/auto_bs*_r1.log; do
    echo "== $(basename "$f" .log)"
    grep -E '^policy (costs at batch <= (1|8|64) |expected)' "$f" | tr -s ' '
  done
fi
tar -C "$out" -czf "$out/policy_${phase}.tgz" logs
