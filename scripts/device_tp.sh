#!/usr/bin/env bash
# Tensor parallelism on a machine with two (or more) GPUs: builds (Release, sm_90a) against the
# CUDA toolkit's NCCL or, where it has none, the pip nvidia-nccl package's; runs cuda_tp_test
# (all-reduce paths, TP=2 against TP=1 per architecture and for DeepSeek's MLA, start-up errors);
# then `bench allreduce` and `bench generate` of the synthetic shapes in SHAPES for each entry of
# TPS (give llama3-70b only TPS="2 2skip": it does not fit one GPU). NVLink multicast stays off.
# SKIP_TESTS=1, SKIP_BENCH=1, SKIP_ALLREDUCE=1 leave parts out; EXTRA_TESTS names more test
# binaries to build and run; GTEST_FILTER narrows cuda_tp_test. Logs to $OUT/tp_logs.tgz.
# Seen on two H200s (2026-11-29): the build about 100 s, cuda_tp_test about 40 s, a llama3-8b
# generate about 30 s, llama3-70b about 60 s: split a full run over two calls of at most 600 s.
set -uo pipefail
out=${OUT:-/tmp/specula-out}
mkdir -p "$out"
# A device call brings back only a few files: every log goes into one archive.
logs=$(mktemp -d)
trap 'tar -czf "$out/tp_logs.tgz" -C "$logs" .' EXIT
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi topo -m >"$logs/topo.log" 2>&1; head -4 "$logs/topo.log"
if ! ls /usr/local/cuda/lib*/libnccl.so* /usr/local/cuda/targets/*/lib/libnccl.so* >/dev/null 2>&1; then
  NCCL_ROOT=$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' 2>/dev/null)
  export NCCL_ROOT
  export LD_LIBRARY_PATH="$NCCL_ROOT/lib:${LD_LIBRARY_PATH:-}"
fi
echo "NCCL_ROOT=${NCCL_ROOT:-the CUDA toolkit}"
build=build/device
if ! cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPECULA_BUILD_BENCH=OFF \
     -DCMAKE_CUDA_ARCHITECTURES=90a >"$logs/configure.log" 2>&1; then
  tail -40 "$logs/configure.log"; exit 1
fi
grep "NCCL" "$logs/configure.log"
if ! cmake --build "$build" -j "$(nproc)" --target specula_main cuda_tp_test ${EXTRA_TESTS:-} -- -k 0 >"$logs/build.log" 2>&1; then
  grep -E "error" -A4 "$logs/build.log" | grep -v "^--$" | head -80; exit 1
fi
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout 400 "$build/tests/cuda_tp_test" ${GTEST_FILTER:+--gtest_filter=$GTEST_FILTER} >"$logs/cuda_tp_test.log" 2>&1
  echo "cuda_tp_test rc=$?"
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|Expected|Which|tensor parallel|seed|error" "$logs/cuda_tp_test.log" | head -60
  for t in ${EXTRA_TESTS:-}; do
    timeout 400 "$build/tests/$t" >"$logs/$t.log" 2>&1
    echo "$t rc=$?"; grep -E "^\[  (FAILED|PASSED) |Failure" "$logs/$t.log" | head -20
  done
fi
[ "${SKIP_BENCH:-0}" = 1 ] && exit 0
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ] && [ "${SKIP_ALLREDUCE:-0}" != 1 ]; then
  timeout 200 "$build/bin/specula" bench allreduce --tp-size 2 >"$logs/allreduce.log" 2>&1
  echo "bench allreduce rc=$?"; cat "$logs/allreduce.log"
fi
# TPS entries: 1, 2, 2nccl (TP=2 with every all-reduce through NCCL: the peer path's worth) or
# 2skip (TP=2 without any all-reduce: wrong output, the step's time without communication).
for shape in ${SHAPES:-llama3-8b}; do
  for tp in ${TPS:-1 2 2nccl 2skip}; do
    n=${tp%nccl}; n=${n%skip}
    env $([ "$tp" != "$n" ] && echo SPECULA_TP_ALLREDUCE=${tp#"$n"}) \
      timeout 400 "$build/bin/specula" bench generate --device cuda --synthetic "$shape" --tp-size "$n" \
      --prompt-len 128 --decode-len "${DECODE_LEN:-256}" --json "$logs/generate_${shape}_tp$tp.json" >"$logs/generate_${shape}_tp$tp.log" 2>&1
    echo "bench generate $shape tp=$tp rc=$?"; grep -E "weights as held|decode tok/s|bound|prefill|error" "$logs/generate_${shape}_tp$tp.log"
  done
done
# SERVE="shape:tp:bs ...": bench serve runs (bs requests at once, 3 x bs requests of 128 in / 128 out).
for spec in ${SERVE:-}; do
  IFS=: read -r shape tp bs <<<"$spec"
  timeout 500 "$build/bin/specula" bench serve --device cuda --synthetic "$shape" --tp-size "$tp" \
    --num-requests $((bs * 3)) --max-running-requests "$bs" --input-len 128 --output-len 128 --max-context-len 512 \
    >"$logs/serve_${shape}_tp${tp}_bs$bs.log" 2>&1
  printf "serve %s tp=%s bs=%s rc=%s %s\n" "$shape" "$tp" "$bs" "$?" \
    "$(grep -E 'output tokens/s|ITL ms|error' "$logs/serve_${shape}_tp${tp}_bs$bs.log" | tr -s ' ' | tr '\n' ' ')"
done
