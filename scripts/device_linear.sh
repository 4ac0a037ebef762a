#!/usr/bin/env bash
# The decode products on a GPU machine: builds this tree (Release, sm_90a: the CLI and the CUDA
# model, engine and speculative tests) and, when .deps/base.tar holds an earlier tree (`git archive
# <commit> -o .deps/base.tar`, carried), that tree's CLI beside it; runs the tests (TESTS, FILTER),
# `bench linear`, and `bench spec-cost --synthetic llama3-8b` with the fixed (7, 1, 8) shape at
# BATCHES for the base and this tree alternately, ROUNDS times. SKIP_TESTS=1 / SKIP_BENCH=1 leave
# out either half, SKIP_SPEC=1 the spec-cost runs. Logs go to $OUT/linear_logs.tgz; a summary is
# printed last; the exit status is non-zero when a test or a benchmark failed.
set -uo pipefail
out=${OUT:-/tmp/specula-out}
logs=$(mktemp -d)
trap 'tar -czf "$out/linear_logs.tgz" -C "$logs" .' EXIT
mkdir -p "$out"
cfg="-G Ninja -DCMAKE_BUILD_TYPE=Release -DSPECULA_BUILD_BENCH=OFF -DCMAKE_CUDA_ARCHITECTURES=90a"
tests=${TESTS:-cuda_model_test cuda_engine_test cuda_speculative_test}
cmake -S . -B build/device $cfg >"$logs/configure.log" 2>&1 || { tail -30 "$logs/configure.log"; exit 1; }
base_pid=
if [ -f .deps/base.tar ]; then
  rm -rf build/base-src && mkdir -p build/base-src && tar -xf .deps/base.tar -C build/base-src
  (cmake -S build/base-src -B build/base $cfg -DSPECULA_BUILD_TESTS=OFF >"$logs/configure_base.log" 2>&1 &&
     cmake --build build/base -j 5 --target specula_main >"$logs/build_base.log" 2>&1) &
  base_pid=$!
fi
targets="specula_main"
[ "${SKIP_TESTS:-0}" = 1 ] || targets="$targets $tests"
if ! cmake --build build/device -j 11 --target $targets -- -k 0 >"$logs/build.log" 2>&1; then
  grep -E "error" -A4 "$logs/build.log" | head -60
  [ -n "$base_pid" ] && { kill "$base_pid" 2>/dev/null; wait "$base_pid"; }
  exit 1
fi
base_ok=0
if [ -n "$base_pid" ]; then
  wait "$base_pid" && base_ok=1 || { echo "base build failed"; tail -20 "$logs/build_base.log"; }
fi
echo "built in ${SECONDS}s"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
failed=0
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  for t in $tests; do
    timeout 420 "build/device/tests/$t" ${FILTER:+"--gtest_filter=$FILTER"} >"$logs/$t.log" 2>&1
    rc=$?
    [ $rc = 0 ] || failed=1
    echo "$t rc=$rc: $(grep -cE '^\[       OK \]' "$logs/$t.log") ok, $(grep -E '^\[  PASSED|^\[  FAILED  \]' "$logs/$t.log" | head -6 | tr '\n' ' ')"
    grep -E "Failure|Expected|Which is|actual" "$logs/$t.log" | head -12
  done
  echo "tests done at ${SECONDS}s"
fi
[ "${SKIP_BENCH:-0}" = 1 ] && exit $failed
new=build/device/bin/specula
base=build/base/bin/specula
timeout 300 "$new" bench linear >"$logs/linear.log" 2>&1
rc=$?
[ $rc = 0 ] || failed=1
echo "bench linear rc=$rc at ${SECONDS}s"
for r in $(seq 1 "${ROUNDS:-1}"); do
  [ "${SKIP_SPEC:-0}" = 1 ] && break
  for side in base new; do
    [ $side = base ] && [ $base_ok = 0 ] && continue
    bin=${!side}
    timeout 400 "$bin" bench spec-cost --synthetic llama3-8b --batch-sizes "${BATCHES:-1,2,4,8,16}" \
      --speculative-policy fixed --json "$logs/spec_${side}_$r.json" >"$logs/spec_${side}_$r.log" 2>&1
    rc=$?
    [ $rc = 0 ] || failed=1
    echo "spec-cost $side r$r rc=$rc at ${SECONDS}s"
  done
done
echo
cat "$logs/linear.log"
for f in "$logs"/spec_*.log; do
  [ -e "$f" ] || continue
  echo "== $(basename "$f")"; grep -vE "^\s*$" "$f" | tail -14; done
exit $failed
