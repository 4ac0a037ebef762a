// Google Benchmark for the CPU attention backend: decode and prefill shapes (32 query heads,
// 8 KV heads, head_dim 128, paged bf16 KV). Counters: query tokens/s and GB/s of KV read
// (decode) or GFLOP/s (prefill), per layer.
#include <benchmark/benchmark.h>

#include "specula/attention/cpu/cpu_backend.h"
#include "specula/cli/attention_bench_case.h"

namespace specula {
namespace {

void run_case(benchmark::State& state, AttentionBenchCase c) {
  AttentionBackendOptions options;
  options.page_size = c.page_size;
  CpuAttentionBackend backend(options);
  AttentionBenchSetup setup(c, backend);
  setup.init_metadata();
  for (auto _ : state) setup.run_layer();
  const double iters = static_cast<double>(state.iterations());
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(setup.num_query_tokens()) * iters, benchmark::Counter::kIsRate);
  state.counters["KV_GB/s"] = benchmark::Counter(setup.kv_bytes_read() * iters / 1e9, benchmark::Counter::kIsRate);
  state.counters["GFLOP/s"] = benchmark::Counter(setup.attention_flops() * iters / 1e9, benchmark::Counter::kIsRate);
}

void BM_Decode(benchmark::State& state) {
  AttentionBenchCase c;
  c.mode = ForwardMode::DECODE;
  c.batch_size = static_cast<int>(state.range(0));
  c.prefix_len = static_cast<int>(state.range(1)) - 1;
  c.page_size = static_cast<int>(state.range(2));
  c.kv_dtype = state.range(3) ? DType::fp8_e4m3 : DType::bf16;
  run_case(state, c);
}
BENCHMARK(BM_Decode)
    ->ArgNames({"batch", "seq_len", "page", "fp8"})
    ->Args({1, 8192, 16, 0})
    ->Args({16, 2048, 16, 0})
    ->Args({16, 2048, 64, 0})
    ->Args({16, 2048, 16, 1})
    ->Args({64, 512, 16, 0})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_Prefill(benchmark::State& state) {
  AttentionBenchCase c;
  c.mode = ForwardMode::EXTEND;
  c.batch_size = 1;
  c.prefix_len = static_cast<int>(state.range(0));
  c.extend_len = static_cast<int>(state.range(1));
  c.head_dim = static_cast<int>(state.range(2));
  c.causal = state.range(3) != 0;
  run_case(state, c);
}
BENCHMARK(BM_Prefill)
    ->ArgNames({"prefix", "extend", "head_dim", "causal"})
    ->Args({0, 2048, 128, 1})
    ->Args({0, 1024, 128, 0})
    ->Args({0, 2048, 64, 1})
    ->Args({4096, 512, 128, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace specula

BENCHMARK_MAIN();
