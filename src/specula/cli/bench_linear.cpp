// `specula bench linear`.
#include "specula/cli/bench_linear.h"

#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "specula/core/error.h"

#ifdef SPECULA_HAS_CUDA
#include <cuda_runtime_api.h>

#include "specula/cli/cuda_ceilings.h"
#include "specula/cli/cuda_timing.h"
#include "specula/core/cuda_check.h"
#include "specula/core/device_memory.h"
#include "specula/model/cuda/cuda_linear.h"
#endif

namespace specula {

namespace {

struct Options {
  std::vector<int> rows = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32};
  int reps = 20;
  std::string device = "cuda:0";
};

#ifdef SPECULA_HAS_CUDA

// Llama-3-8B's shapes.
constexpr int kHidden = 4096, kQkv = 6144, kInter = 14336, kVocab = 128256;

struct Scratch {
  Buffer x, xb, y, act, gate_up, split, halves;
};

void run(const Options& o) {
  const Device device = parse_device(o.device);
  SPECULA_CHECK(device.is_cuda(), "--device {}: bench linear times GPU kernels, give cuda or cuda:N", o.device);
  SPECULA_CHECK(cuda_available(), "bench linear times GPU kernels: no CUDA device is visible");
  SPECULA_CHECK(device.index < cuda_device_count(), "--device {}: this machine has {} CUDA device(s)", o.device,
                cuda_device_count());
  int most = 1;
  for (int n : o.rows) {
    SPECULA_CHECK(n >= 1 && n <= 256, "--rows {}: allowed 1..256", n);
    most = std::max(most, n);
  }
  SPECULA_CHECK(o.reps >= 3, "--reps {}: at least 3", o.reps);
  CUDA_CHECK(cudaSetDevice(device.index));
  const CudaCeilings ceilings = measure_cuda_ceilings(device);
  Buffer qkv(DType::bf16, {int64_t{kQkv} * kHidden}, device), wo(DType::bf16, {int64_t{kHidden} * kHidden}, device);
  Buffer gate_up(DType::bf16, {int64_t{2} * kInter * kHidden}, device), down(DType::bf16, {int64_t{kHidden} * kInter}, device);
  Buffer head(DType::bf16, {int64_t{kVocab} * kHidden}, device);
  uint64_t seed = 11;
  for (const Buffer* b : {&qkv, &wo, &gate_up, &down, &head}) fill_random_bf16(*b, seed++);
  const double layer_bytes = static_cast<double>(qkv.nbytes() + wo.nbytes() + gate_up.nbytes() + down.nbytes());
  const double head_bytes = static_cast<double>(head.nbytes());
  const double layer_read = measure_cuda_read_tbps(device, static_cast<size_t>(layer_bytes), "cold");
  const double head_read = measure_cuda_read_tbps(device, static_cast<size_t>(head_bytes), "cold");

  Scratch s;
  const int64_t m = most;
  s.x = Buffer(DType::f32, {m * kInter}, device);
  s.xb = Buffer(DType::bf16, {m * kHidden}, device);
  s.y = Buffer(DType::f32, {m * kVocab}, device);
  s.act = Buffer(DType::f32, {m * kInter}, device);
  s.gate_up = Buffer(DType::f32, {m * 2 * kInter}, device);
  s.split = Buffer(DType::bf16, {2 * m * kInter}, device);
  s.halves = Buffer(DType::f32, {2 * m * kVocab}, device);
  {
    // Activations of unit scale that are not bf16 values, so the split has two terms.
    std::vector<float> x(static_cast<size_t>(m * kInter));
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 2654435761u) % 2000003) / 1000001.5f - 1.0f;
    copy(s.x, TensorView(x.data(), DType::f32, {m * kInter}));
    CUDA_CHECK(cudaMemset(s.xb.data(), 0x3f, static_cast<size_t>(s.xb.nbytes())));
  }

  fmt::print("specula bench linear  {}  Llama-3-8B shapes, bf16 weights, f32 activations (o_proj: bf16)\n",
             ceilings.device_name);
  fmt::print("copy {:.0f} GB/s; cold-L2 read of the layer's {:.0f} MB: {:.0f} GB/s, of the lm_head's {:.0f} MB: {:.0f} GB/s\n\n",
             ceilings.copy_tbps * 1e3, layer_bytes / 1e6, layer_read * 1e3, head_bytes / 1e6, head_read * 1e3);
  fmt::print("{:>5} {:>7} | {:>9} {:>9} | {:>9} {:>6} | {:>9} {:>9} | {:>9}\n", "rows", "auto", "gemv ms",
             "cublas ms", "best GB/s", "%read", "head gemv", "cublas", "head GB/s");
  cudaStream_t stream = nullptr;  // the legacy stream, which cuda_median_seconds times
  // The rule as the engine applies it, and each path forced (one cuBLAS handle each, for the run).
  CudaLinear rule(device, stream, false), gemv_only(device, stream, false), gemm_only(device, stream, false);
  gemv_only.force_path(CudaLinear::Path::gemv);
  gemm_only.force_path(CudaLinear::Path::gemm);
  CudaLinear* const forced[] = {&gemv_only, &gemm_only};
  for (int n : o.rows) {
    double layer_ms[2] = {0, 0}, head_ms[2] = {0, 0};
    for (int p = 0; p < 2; ++p) {
      const CudaLinear& linear = *forced[p];
      float* x = s.x.data_as<float>();
      float* y = s.y.data_as<float>();
      void* hi = s.split.data();
      auto product = [&](const Buffer& w, const float* in_x, float* out_y, int in, int out) {
        const bool split = linear.needs_split(w, n, in);
        void* lo_here = static_cast<uint16_t*>(hi) + int64_t{n} * in;
        linear(in_x, w, Buffer{}, out_y, n, in, out, split ? hi : nullptr, split ? lo_here : nullptr,
               split && CudaLinear::stacks(n, out) ? s.halves.data_as<float>() : nullptr);
      };
      auto layer = [&] {
        product(qkv, x, y, kHidden, kQkv);
        linear.product_bf16_x(s.xb.data(), wo, Buffer{}, y, n, kHidden, kHidden, x);
        linear.gated(x, gate_up, Buffer{}, s.act.data_as<float>(), n, kHidden, kInter, false, s.gate_up.data_as<float>(),
                     hi, static_cast<uint16_t*>(hi) + int64_t{n} * kHidden, s.halves.data_as<float>());
        product(down, s.act.data_as<float>(), y, kInter, kHidden);
      };
      layer_ms[p] = cuda_median_seconds(layer, o.reps) * 1e3;
      head_ms[p] = cuda_median_seconds([&] { product(head, x, y, kHidden, kVocab); }, o.reps) * 1e3;
    }
    const bool gemv = rule.path(qkv, n, kHidden) == CudaLinear::Path::gemv;
    const double best_layer = std::min(layer_ms[0], layer_ms[1]);
    const double best_head = std::min(head_ms[0], head_ms[1]);
    const double gbps = layer_bytes / (best_layer * 1e-3) / 1e9;
    fmt::print("{:>5} {:>7} | {:>9.3f} {:>9.3f} | {:>9.0f} {:>5.0f}% | {:>9.3f} {:>9.3f} | {:>9.0f}\n", n,
               gemv ? "gemv" : "cublas", layer_ms[0], layer_ms[1], gbps, 100.0 * gbps / (layer_read * 1e3),
               head_ms[0], head_ms[1], head_bytes / (best_head * 1e-3) / 1e9);
  }
}

#else

void run(const Options&) { SPECULA_CHECK(false, "bench linear needs a CUDA build"); }

#endif

}  // namespace

void add_bench_linear_command(CLI::App& bench) {
  auto o = std::make_shared<Options>();
  CLI::App* cmd = bench.add_subcommand("linear", "Decode products of Llama-3-8B shapes: the GEMV against cuBLAS");
  cmd->add_option("--rows", o->rows, "Activation rows to time (1..256)")->delimiter(',')->capture_default_str();
  cmd->add_option("--reps", o->reps, "Timed calls per case (median)")->capture_default_str();
  cmd->add_option("--device", o->device, "cuda or cuda:N")->capture_default_str();
  cmd->callback([o] { run(*o); });
}

}  // namespace specula
