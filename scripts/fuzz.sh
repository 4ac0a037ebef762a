#!/usr/bin/env bash
# Builds the `fuzz` preset (clang, libFuzzer + ASan + UBSan; fuzz/) and runs every parser
# fuzzer for FUZZ_SECONDS (default 60) each, on a scratch copy of its seed corpus
# (fuzz/corpus/<target>/, never modified). Prints one summary line per target and exits
# non-zero if any target reported a crash, sanitizer error, leak, timeout or out-of-memory; the
# inputs that caused them are left in $FUZZ_OUT/<target>/artifacts/ (named in the output).
#
#   FUZZ_SECONDS=60          seconds per target (libFuzzer -max_total_time)
#   FUZZ_TARGETS="..."       which targets (default: all of them)
#   FUZZ_OUT=build/fuzz/run  scratch corpora, logs and artifacts (wiped per target at start)
#   FUZZ_CORPUS=fuzz/corpus  the seed corpus root to copy from
#   FUZZ_BUILD_JOBS=N        parallel compile jobs (default: the generator's)
#   FUZZ_SKIP_BUILD=1        use the existing build/fuzz binaries
#
# Leak detection stays on (ASan's LeakSanitizer, libFuzzer -detect_leaks=1): the fuzzers keep
# their long-lived tokenizers behind a global pointer, so they are never reported.
set -euo pipefail
cd "$(dirname "$0")/.."

FUZZ_SECONDS=${FUZZ_SECONDS:-60}
FUZZ_TARGETS=${FUZZ_TARGETS:-fuzz_config fuzz_safetensors fuzz_tokenizer_load fuzz_tokenizer_text fuzz_openai_request fuzz_chat_template fuzz_grammar fuzz_ds_config}
FUZZ_OUT=${FUZZ_OUT:-build/fuzz/run}
FUZZ_CORPUS=${FUZZ_CORPUS:-fuzz/corpus}

# Inputs larger than these are never generated: tokenizer.json / config.json fit in 64 KiB,
# a safetensors header plus some data in 256 KiB, tokenizer text in 16 KiB.
max_len_of() {
  case "$1" in
    fuzz_safetensors) echo 262144 ;;
    fuzz_tokenizer_text) echo 16384 ;;
    *) echo 65536 ;;
  esac
}

# The JSON parsers get a dictionary of JSON syntax, the keys they read and edge-case numbers.
dict_of() {
  case "$1" in
    fuzz_config | fuzz_safetensors | fuzz_tokenizer_load | fuzz_openai_request | fuzz_ds_config) echo "-dict=fuzz/json.dict" ;;
  esac
}

if [[ -z "${FUZZ_SKIP_BUILD:-}" ]]; then
  cmake --preset fuzz
  cmake --build --preset fuzz ${FUZZ_BUILD_JOBS:+-j "$FUZZ_BUILD_JOBS"}
fi

export ASAN_OPTIONS="detect_leaks=1:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"

# The last value of libFuzzer's -print_final_stats line "stat::<name>: <value>" in $dir/log.
final_stat() { sed -n "s/^stat::$1: *//p" "$dir/log" | tail -n 1; }

failed=()
summary=()
for target in $FUZZ_TARGETS; do
  bin=build/fuzz/bin/$target
  dir=$FUZZ_OUT/$target
  rm -rf "$dir"
  mkdir -p "$dir/corpus" "$dir/artifacts"
  if [[ -d "$FUZZ_CORPUS/$target" ]]; then cp -R "$FUZZ_CORPUS/$target/." "$dir/corpus/"; fi
  echo "fuzz: $target for ${FUZZ_SECONDS}s (log $dir/log)"
  rc=0
  "$bin" "$dir/corpus" -max_total_time="$FUZZ_SECONDS" -rss_limit_mb=2048 -timeout=10 \
    -max_len="$(max_len_of "$target")" $(dict_of "$target") -detect_leaks=1 -print_final_stats=1 \
    -artifact_prefix="$dir/artifacts/" >"$dir/log" 2>&1 || rc=$?

  execs=$(final_stat number_of_executed_units)
  rate=$(final_stat average_exec_per_sec)
  new=$(final_stat new_units_added)
  cov=$(grep -oE 'cov: [0-9]+' "$dir/log" | tail -n 1 | cut -d' ' -f2 || true)
  status=ok
  if ((rc != 0)); then
    if grep -q 'ERROR: libFuzzer: timeout' "$dir/log"; then status=TIMEOUT
    elif grep -q 'ERROR: libFuzzer: out-of-memory' "$dir/log"; then status=OOM
    elif grep -q 'ERROR: LeakSanitizer' "$dir/log"; then status=LEAK
    else status=CRASH
    fi
  fi
  line=$(printf '%-20s %-7s execs %-9s exec/s %-7s cov %-6s new_units %s' "$target" "$status" \
    "${execs:-?}" "${rate:-?}" "${cov:-?}" "${new:-?}")
  summary+=("$line")
  if [[ $status != ok ]]; then
    failed+=("$target")
    echo "fuzz: $target: $status (exit $rc); from $dir/log:"
    { grep -E 'ERROR|SUMMARY|runtime error|^fuzz|Assertion' "$dir/log" | head -n 6
      grep -E '#[0-9]+ 0x.*(src/specula|/fuzz/)' "$dir/log" | head -n 6; } | cut -c1-240 | sed 's/^/  /' || true
    echo "fuzz: $target: inputs kept in $dir/artifacts/: $(ls "$dir/artifacts" | tr '\n' ' ')"
  fi
done

echo "fuzz: summary (${FUZZ_SECONDS}s per target)"
printf 'fuzz:   %s\n' "${summary[@]}"
if ((${#failed[@]})); then
  echo "fuzz: FAILED: ${failed[*]} (reproduce: build/fuzz/bin/<target> <artifact>)"
  exit 1
fi
echo "fuzz: all targets clean"
