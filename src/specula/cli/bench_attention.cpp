// `specula bench attention`: the CPU run uses shapes sized for a small machine; the figures are
// per layer (one attention call), with KV bandwidth for decode and FLOP rate for prefill.
#include "specula/cli/bench_attention.h"

#include <string>
#include <utility>
#include <vector>
#include <fmt/format.h>

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "specula/cli/attention_bench_case.h"
#include "specula/cli/cpu_ceilings.h"
#include "specula/cli/bench_double_sparsity.h"
#include "specula/cli/bench_mla.h"
#include "specula/cli/json_file.h"
#include "specula/core/thread_pool.h"

#ifdef SPECULA_HAS_CUDA
#include "specula/cli/cuda_ceilings.h"
#include "specula/cli/cuda_timing.h"
#endif

namespace specula {

namespace {

struct Options {
  std::string device = "cpu";
  std::string json_path;
  std::string kv_dtype = "bf16";
  std::string filter;
  std::string l2 = "cold";
  bool l2_given = false;  // --l2 on the command line (it only means something on a GPU)
  int threads = 0;
  double min_seconds = 0.3;
  bool mla = false;
  bool double_sparsity = false;
  int ds_heavy_channel_num = 16;
  int ds_token_fraction = 16;
};

std::vector<AttentionBenchCase> cpu_cases(DType kv_dtype) {
  auto decode = [&](std::string name, int bs, int seq_len, int page_size) {
    AttentionBenchCase c;
    c.name = std::move(name);
    c.mode = ForwardMode::DECODE;
    c.batch_size = bs;
    c.prefix_len = seq_len - 1;
    c.page_size = page_size;
    c.kv_dtype = kv_dtype;
    return c;
  };
  auto prefill = [&](std::string name, int bs, int prefix, int extend, int head_dim, bool causal) {
    AttentionBenchCase c;
    c.name = std::move(name);
    c.mode = ForwardMode::EXTEND;
    c.batch_size = bs;
    c.prefix_len = prefix;
    c.extend_len = extend;
    c.head_dim = head_dim;
    c.causal = causal;
    c.kv_dtype = kv_dtype;
    return c;
  };
  auto dca_decode = [&](bool dca) {
    AttentionBenchCase c = decode(dca ? "dca decode B=1 L=524288 p16 qwen2.5-7b-1m" : "decode B=1 L=524288 p16 28q/4kv", 1,
                                  524288, 16);
    c.num_q_heads = 28;
    c.num_kv_heads = 4;
    c.dca_chunk_len = dca ? 262144 - 8192 : 0;
    c.dca_original_max = dca ? 262144 : 0;
    return c;
  };
  return {
      decode("decode B=1 L=8192 p16", 1, 8192, 16),
      // The L=8192 pool (34 MB) mostly fits a 32 MB L3 across calls; this one (134 MB) does not.
      decode("decode B=1 L=32768 p16", 1, 32768, 16),
      decode("decode B=16 L=2048 p16", 16, 2048, 16),
      decode("decode B=16 L=2048 p64", 16, 2048, 64),
      decode("decode B=64 L=512 p16", 64, 512, 16),
      prefill("prefill causal hd128 S=2048", 1, 0, 2048, 128, true),
      prefill("prefill noncausal hd128 S=1024", 1, 0, 1024, 128, false),
      prefill("prefill causal hd64 S=2048", 1, 0, 2048, 64, true),
      prefill("extend prefix=4096 +512 hd128", 1, 4096, 512, 128, true),
      // Dual chunk decode on Qwen2.5-7B-Instruct-1M's shape past two chunks (253,952 keys each),
      // beside plain decode of the same keys.
      dca_decode(true),
      dca_decode(false),
  };
}

// The GPU shapes: decode with 32 query / 8 KV heads, head_dim 128, paged bf16 KV;
// prefill with 32 heads (MHA), B=2, S=8192; an extend over a paged prefix.
std::vector<AttentionBenchCase> cuda_cases(DType kv_dtype) {
  std::vector<AttentionBenchCase> cases;
  for (int ps : {16, 64}) {
    for (auto [bs, len] : {std::pair{1, 32768}, std::pair{64, 4096}, std::pair{256, 1024}}) {
      AttentionBenchCase c;
      c.name = fmt::format("decode B={} L={} p{}", bs, len, ps);
      c.mode = ForwardMode::DECODE;
      c.batch_size = bs;
      c.prefix_len = len - 1;
      c.page_size = ps;
      c.kv_dtype = kv_dtype;
      cases.push_back(c);
    }
  }
  // B=1 as inside a model step: eight layers back to back, so each call's launch and start overlap
  // the call before it instead of landing between the timing events.
  for (int ps : {16, 64}) {
    AttentionBenchCase c;
    c.name = fmt::format("decode B=1 L=32768 p{} x8 layers", ps);
    c.mode = ForwardMode::DECODE;
    c.prefix_len = 32767;
    c.page_size = ps;
    c.kv_dtype = kv_dtype;
    c.layers = 8;
    cases.push_back(c);
  }
  for (int hd : {64, 128}) {
    for (bool causal : {true, false}) {
      AttentionBenchCase c;
      c.name = fmt::format("prefill {} hd{} B=2 S=8192", causal ? "causal" : "noncausal", hd);
      c.mode = ForwardMode::EXTEND;
      c.batch_size = 2;
      c.extend_len = 8192;
      c.head_dim = hd;
      c.num_kv_heads = 32;
      c.causal = causal;
      c.kv_dtype = kv_dtype;
      cases.push_back(c);
    }
  }
  // Qwen2.5-7B-Instruct-1M's shape (28 query / 4 KV heads, chunk_size 262144 and local_size 8192:
  // chunks of 253,952 keys) with dual chunk attention, or plain attention over the same keys.
  auto qwen_1m = [&](std::string name, ForwardMode mode, int prefix, int extend, bool dca) {
    AttentionBenchCase c;
    c.name = std::move(name) + " p16 qwen2.5-7b-1m";
    c.mode = mode;
    c.prefix_len = prefix;
    c.extend_len = extend;
    c.num_q_heads = 28;
    c.num_kv_heads = 4;
    c.kv_dtype = kv_dtype;
    c.dca_chunk_len = dca ? 262144 - 8192 : 0;
    c.dca_original_max = dca ? 262144 : 0;
    return c;
  };
  for (int len : {262144, 1048576}) {
    for (bool dca : {true, false}) {
      cases.push_back(qwen_1m(fmt::format("{} B=1 L={}", dca ? "dca decode" : "decode", len), ForwardMode::DECODE,
                              len - 1, 1, dca));
    }
  }
  // Prefill: a 131,072-token prompt (inside the first chunk: one pass) and an extend of 8,192
  // tokens past two chunks (three passes and their merge).
  for (bool dca : {true, false}) {
    for (auto [prefix, extend] : {std::pair{0, 131072}, std::pair{516096, 8192}}) {
      cases.push_back(qwen_1m(fmt::format("{} {}", dca ? "dca" : "plain",
                                          prefix == 0 ? fmt::format("prefill S={}", extend)
                                                      : fmt::format("extend {}+{}", prefix, extend)),
                              ForwardMode::EXTEND, prefix, extend, dca));
    }
  }
  // The sparse prefill pattern on the 131,072-token prompt: 1,000 vertical and 6,096 slash lines
  // per head (of the sizes Qwen2.5-1M's sparse_attention_config gives), threshold 32,768.
  auto pattern = std::make_shared<DualChunkSparsePattern>();
  pattern->vertical.assign(28, 1000);
  pattern->slash.assign(28, 6096);
  cases.push_back(qwen_1m("dca sparse prefill S=131072", ForwardMode::EXTEND, 0, 131072, true));
  cases.back().dca_sparse = pattern;
  AttentionBenchCase e;
  e.name = "extend prefix=8192 +1024 B=2 p16";
  e.mode = ForwardMode::EXTEND;
  e.batch_size = 2;
  e.prefix_len = 8192;
  e.extend_len = 1024;
  e.kv_dtype = kv_dtype;
  cases.push_back(e);
  return cases;
}

struct Result {
  AttentionBenchCase c;
  double seconds = 0;  // per call
  int iterations = 0;
  int64_t query_tokens = 0;
  double kv_gbps = 0;
  double gflops = 0;
  double read_gbps = 0;  // GPU decode: a streaming read of the same bytes, timed the same way
};

Result time_case(const AttentionBenchCase& c, AttentionBackend& backend, const Options& o, Device device) {
  AttentionBenchSetup setup(c, backend, device);
#ifdef SPECULA_HAS_CUDA
  if (device.is_cuda()) {
    setup.init_metadata();
    Result r;
    r.c = c;
    r.iterations = 30;
    r.seconds = cuda_median_seconds(
                    [&] {
                      for (int l = 0; l < c.layers; ++l) setup.run_layer(l);
                    },
                    r.iterations, 3, parse_l2_start(o.l2)) /
                c.layers;
    r.query_tokens = setup.num_query_tokens();
    r.kv_gbps = setup.kv_bytes_read() / r.seconds / 1e9;
    r.gflops = setup.attention_flops() / r.seconds / 1e9;
    if (c.mode == ForwardMode::DECODE && c.layers == 1) {
      r.read_gbps = measure_cuda_read_tbps(device, static_cast<size_t>(setup.kv_bytes_read()), o.l2) * 1e3;
    }
    return r;
  }
#endif
  setup.init_metadata();
  setup.run_layer();  // warm-up: page in the cache, grow scratch
  using clock = std::chrono::steady_clock;
  int iterations = 0;
  const auto start = clock::now();
  double elapsed = 0;
  do {
    setup.run_layer();
    ++iterations;
    elapsed = std::chrono::duration<double>(clock::now() - start).count();
  } while (elapsed < o.min_seconds);
  Result r;
  r.c = c;
  r.iterations = iterations;
  r.seconds = elapsed / iterations;
  r.query_tokens = setup.num_query_tokens();
  r.kv_gbps = setup.kv_bytes_read() / r.seconds / 1e9;
  r.gflops = setup.attention_flops() / r.seconds / 1e9;
  return r;
}

int run(const Options& o) {
  check_json_path(o.json_path);
  const Device device = parse_device(o.device);
  SPECULA_CHECK(device.is_cpu() || cuda_available(),
                "--device {}: this build or machine has no CUDA device (build with nvcc, run on a GPU)", o.device);
  SPECULA_CHECK(!(device.is_cpu() && o.l2_given),
                "--l2 {}: the L2 state at each call's start is set only for CUDA devices, not --device {}", o.l2,
                o.device);
  const DType kv_dtype = parse_dtype(o.kv_dtype);
  std::unique_ptr<ThreadPool> own_pool;
  AttentionBackendOptions bo;
  bo.device = device;
  SPECULA_CHECK(o.threads >= 0, "--threads {} is not valid; expected a positive count (0: default)", o.threads);
  SPECULA_CHECK(o.min_seconds >= 0, "--min-seconds {} is not valid; expected >= 0", o.min_seconds);
  if (o.threads > 0) {
    own_pool = std::make_unique<ThreadPool>(o.threads);
    bo.thread_pool = own_pool.get();
  }
  const int threads = own_pool ? own_pool->num_threads() : default_thread_pool().num_threads();
  const std::string backend_name = device.is_cpu() ? "cpu" : "cuda";
#ifdef SPECULA_HAS_CUDA
  if (device.is_cuda()) parse_l2_start(o.l2);  // a bad value fails before the ceilings run
#endif

  // Ceilings in GB/s and GFLOP/s, whatever the device.
  double copy_ceiling = 0, flop_ceiling = 0;
  std::string ceiling_line;
  if (device.is_cpu()) {
    ThreadPool& pool = own_pool ? *own_pool : default_thread_pool();
    const CpuCeilings ceilings = measure_cpu_ceilings(pool);
    copy_ceiling = ceilings.copy_gbps;
    flop_ceiling = ceilings.sgemm_gflops;
    ceiling_line = fmt::format("copy {:.1f} GB/s (read + written), sgemm {:.1f} GFLOP/s (OpenBLAS f32)", copy_ceiling,
                               flop_ceiling);
  } else {
#ifdef SPECULA_HAS_CUDA
    const CudaCeilings ceilings = measure_cuda_ceilings(device);
    copy_ceiling = ceilings.copy_tbps * 1e3;
    flop_ceiling = ceilings.gemm_tflops * 1e3;
    ceiling_line = fmt::format("{}: device copy {:.2f} TB/s (read + written), bf16 cuBLAS GEMM {:.0f} TFLOP/s",
                               ceilings.device_name, ceilings.copy_tbps, ceilings.gemm_tflops);
#endif
  }

  std::vector<Result> results;
  for (const AttentionBenchCase& c : device.is_cpu() ? cpu_cases(kv_dtype) : cuda_cases(kv_dtype)) {
    if (!o.filter.empty() && c.name.find(o.filter) == std::string::npos) continue;
    bo.page_size = c.page_size;
    auto backend = make_attention_backend(backend_name, bo);
    results.push_back(time_case(c, *backend, o, device));
  }

  const bool gpu = device.is_cuda();
  const double unit = gpu ? 1e3 : 1.0;  // GPU figures in TB/s and TFLOP/s
  fmt::print("specula bench attention  device={} backend={} threads={} kv_dtype={}\n", device.str(), backend_name,
             threads, dtype_name(kv_dtype));
  fmt::print("ceilings measured now: {}\n", ceiling_line);
  fmt::print("one layer per call (x8 layers: eight layers' calls back to back, figures per layer); decode: 32 query / "
             "8 KV heads, head_dim 128{}{}\n\n",
             gpu ? "; prefill: 32 heads (MHA)" : "; prefill: 32 query / 8 KV heads",
             gpu ? fmt::format("; L2 {} at each call's start", o.l2) : "");
  // GPU decode rows also give the rate of a plain streaming read of the same bytes (cuda_ceilings.h)
  // and the case's share of it: the copy rate is not reachable by a read that short.
  fmt::print("{:<34} {:>9} {:>12} {:>9} {:>8} {:>9} {:>8}{}\n", "case", "ms/call", "query tok/s",
             gpu ? "KV TB/s" : "KV GB/s", "of copy", gpu ? "TFLOP/s" : "GFLOP/s", "of gemm",
             gpu ? fmt::format(" {:>9} {:>8}", "read TB/s", "of read") : "");
  for (const Result& r : results) {
    const bool decode = r.c.mode == ForwardMode::DECODE;
    const std::string read = r.read_gbps > 0 ? fmt::format(" {:>9.2f} {:>8}", r.read_gbps / unit,
                                                           fmt::format("{:.0f}%", 100 * r.kv_gbps / r.read_gbps))
                                             : "";
    fmt::print("{:<34} {:>9.3f} {:>12.0f} {:>9.2f} {:>8} {:>9.1f} {:>8}{}\n", r.c.name, r.seconds * 1e3,
               static_cast<double>(r.query_tokens) / r.seconds, r.kv_gbps / unit,
               decode ? fmt::format("{:.0f}%", 100 * r.kv_gbps / copy_ceiling) : "", r.gflops / unit,
               decode ? "" : fmt::format("{:.0f}%", 100 * r.gflops / flop_ceiling), read);
  }
  if (!o.json_path.empty()) {
    nlohmann::json j;
    j["device"] = device.str();
    j["backend"] = backend_name;
    j["threads"] = threads;
    j["kv_dtype"] = dtype_name(kv_dtype);
    if (gpu) j["l2_start"] = o.l2;
    j["ceilings"] = {{"copy_gbytes_per_second", copy_ceiling}, {"gemm_gflops", flop_ceiling}, {"what", ceiling_line}};
    for (const Result& r : results) {
      j["results"].push_back({{"case", r.c.name},
                              {"mode", forward_mode_name(r.c.mode)},
                              {"batch_size", r.c.batch_size},
                              {"prefix_len", r.c.prefix_len},
                              {"extend_len", r.c.extend_len},
                              {"head_dim", r.c.head_dim},
                              {"page_size", r.c.page_size},
                              {"causal", r.c.causal},
                              {"layers", r.c.layers},
                              {"seconds_per_call", r.seconds},
                              {"iterations", r.iterations},
                              {"query_tokens_per_second", static_cast<double>(r.query_tokens) / r.seconds},
                              {"kv_gbytes_per_second", r.kv_gbps},
                              {"same_bytes_read_gbytes_per_second", r.read_gbps},
                              {"gflops", r.gflops}});
    }
    write_json_file(o.json_path, j);
    fmt::print("\nwrote {}\n", o.json_path);
  }
  return 0;
}

}  // namespace

void add_bench_attention_command(CLI::App& bench) {
  auto options = std::make_shared<Options>();
  CLI::App* cmd = bench.add_subcommand("attention", "Benchmark the attention backend on decode and prefill shapes");
  cmd->add_option("--device", options->device, "cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--json", options->json_path, "Also write the results as JSON to this file");
  cmd->add_option("--kv-dtype", options->kv_dtype, "KV cache dtype: bf16, f16, f32, fp8_e4m3")->capture_default_str();
  cmd->add_option("--threads", options->threads, "CPU threads (default: SPECULA_NUM_THREADS or all cores)");
  cmd->add_option("--filter", options->filter, "Run only cases whose name contains this text");
  cmd->add_option("--min-seconds", options->min_seconds, "Minimum timed seconds per case")->capture_default_str();
  CLI::Option* l2 = cmd->add_option("--l2", options->l2,
                  "GPU: the L2 at each timed call's start: cold (evicted by a read, clean), dirty (evicted by a "
                  "write, as Triton's do_bench does) or warm")
      ->capture_default_str();
  cmd->add_flag("--mla", options->mla, "Benchmark MLA and sparse MLA (DeepSeek shapes) instead; CUDA only");
  cmd->add_flag("--double-sparsity", options->double_sparsity,
                "Benchmark double-sparsity decode against dense decode of the same cache instead; CUDA only");
  cmd->add_option("--ds-heavy-channel-num", options->ds_heavy_channel_num,
                  "--double-sparsity: label channels per KV head")
      ->capture_default_str();
  cmd->add_option("--ds-token-fraction", options->ds_token_fraction,
                  "--double-sparsity: heavy tokens are the context divided by this")
      ->capture_default_str();
  cmd->callback([options, l2] {
    options->l2_given = l2->count() > 0;
    if (options->double_sparsity) {
      run_ds_bench({options->device == "cpu" ? "cuda" : options->device, options->json_path, options->filter,
                    options->l2, options->ds_heavy_channel_num, options->ds_token_fraction});
      return;
    }
    if (options->mla) {
      run_mla_bench({options->device == "cpu" ? "cuda" : options->device, options->json_path, options->filter,
                     options->l2});
      return;
    }
    run(*options);
  });
}

}  // namespace specula
