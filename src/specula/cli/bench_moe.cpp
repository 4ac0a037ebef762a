// The MoE benchmark: CudaMoe layers built from synthetic weights (several layers, so that a
// timed call finds its experts out of the L2, as a model's layer does), timed with CUDA events.
#include "specula/cli/bench_moe.h"

#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "specula/cli/json_file.h"
#include "specula/core/device.h"
#include "specula/core/error.h"
#include "specula/model/fp8_weights.h"
#include "specula/model/synthetic.h"

#ifdef SPECULA_HAS_CUDA
#include <cuda_runtime_api.h>

#include "specula/cli/cuda_ceilings.h"
#include "specula/cli/cuda_timing.h"
#include "specula/model/cuda/cuda_linear.h"
#include "specula/model/cuda/cuda_moe.h"
#include "specula/model/cuda/decoder_layer.h"
#include "specula/model/cuda/moe_kernels.h"
#include "specula/model/weight_loader.h"
#endif

namespace specula {

namespace {

struct Options {
  std::vector<std::string> shapes = {"deepseek-v2-lite", "qwen3-30b-a3b"};
  std::vector<int> batches = {1, 8, 64};
  int prefill = 4096;
  int layers = 4;
  bool fp8 = false;
  std::string json_path;
};

// Flag errors come first, whatever the build and the machine.
void check_flags(const Options& o) {
  SPECULA_CHECK(o.layers >= 1 && o.prefill >= 1, "--layers {} and --prefill {} must be positive", o.layers, o.prefill);
  for (int n : o.batches) SPECULA_CHECK(n >= 1, "--batches {}: batch sizes must be positive", n);
  for (const std::string& shape : o.shapes) {
    SPECULA_CHECK(synthetic_config(shape).has_moe(), "--shape {} has no mixture-of-experts layers", shape);
  }
}

#ifdef SPECULA_HAS_CUDA
namespace ck = cuda_kernels;

// DeepSeek-V3's fp8 layout over a synthetic model: every expert matrix as random e4m3 codes (no
// NaN) with 128 x 128 block scales; everything else as the synthetic source makes it.
class SyntheticFp8Experts final : public WeightSource {
 public:
  explicit SyntheticFp8Experts(const SyntheticWeights& base) : base_(base) {}
  TensorView get(const std::string& name, const Shape& shape) const override {
    const bool expert = name.find("experts.") != std::string::npos;
    if (expert && name.ends_with("_scale_inv")) {
      scratch_ = Buffer(DType::f32, shape);
      std::fill_n(scratch_.data_as<float>(), shape.numel(), 1.0f / 4096.0f);
      return scratch_.view();
    }
    if (!expert || !name.ends_with("_proj.weight")) return base_.get(name, shape);
    scratch_ = Buffer(DType::fp8_e4m3, shape);
    auto* q = static_cast<uint8_t*>(scratch_.data());
    uint64_t x = std::hash<std::string>{}(name) | 1;
    for (int64_t i = 0; i < shape.numel(); ++i) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      q[i] = static_cast<uint8_t>((x >> 56) & 0xf7);  // never 0x7f / 0xff (NaN)
    }
    return scratch_.view();
  }
  bool contains(const std::string& name) const override { return base_.contains(name); }
  size_t total_bytes() const override { return base_.total_bytes(); }

 private:
  const SyntheticWeights& base_;
  mutable Buffer scratch_;
};

void run(const Options& o) {
  check_flags(o);
  SPECULA_CHECK(cuda_available(), "bench moe times the GPU layer: no CUDA device is visible");
  const Device dev = Device::cuda(0);
  const CudaCeilings ceilings = measure_cuda_ceilings(dev);
  fmt::print("{}: copy {:.2f} TB/s, bf16 cuBLAS GEMM {:.0f} TFLOP/s\n", ceilings.device_name, ceilings.copy_tbps,
             ceilings.gemm_tflops);
  nlohmann::json out = nlohmann::json::array();
  CudaLinear linear(dev, nullptr, false);
  for (const std::string& shape : o.shapes) {
    const ModelConfig config = synthetic_config(shape);
    SPECULA_CHECK(config.has_moe(), "--shape {} has no mixture-of-experts layers", shape);
    const MoeConfig& m = config.moe;
    const int h = config.hidden_size, E = m.n_routed_experts, k = m.num_experts_per_tok;
    const int inter = m.moe_intermediate_size, S = m.n_shared_experts, per_token = k + S, stacked = E + S;
    const SyntheticWeights synthetic(config, 7);
    const SyntheticFp8Experts fp8_experts(synthetic);
    ModelConfig fp8_config = config;
    fp8_config.fp8_block_out = fp8_config.fp8_block_in = 128;
    const Fp8BlockWeights fp8_weights(fp8_experts, fp8_config);
    const WeightSource& weights = o.fp8 ? static_cast<const WeightSource&>(fp8_weights) : synthetic;
    F32WeightLoader load(weights);
    std::vector<std::unique_ptr<CudaMoe>> layers;
    for (int l = 0; l < o.layers; ++l) {
      const std::string prefix = "model.layers." + std::to_string(l + 1) + ".";
      const MoeWeights host = load_moe_weights(load, prefix, config, false);
      layers.push_back(std::make_unique<CudaMoe>(m, host, &weights, prefix, h, dev, o.fp8));
      SPECULA_CHECK(layers.back()->fp8() == o.fp8, "bench moe: the layer's experts are not held as asked");
    }
    CudaLayerScratch scratch;
    const CudaStepLinear step{linear, scratch, dev};
    std::mt19937 rng(3);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    fmt::print("\n{}: {} experts (top {}, {} shared) of {} x {}, {}\n", shape, E, k, m.n_shared_experts, h, inter,
               o.fp8 ? "fp8 e4m3 with 128 x 128 block scales" : "bf16");
    fmt::print("{:>7} {:>10} {:>9} {:>9} {:>10} {:>10} {:>7} {:>10} {:>10} {:>10}\n", "tokens", "us/layer", "experts", "MB read",
               "TB/s", "ceiling", "frac", "GEMMs us", "GEMMs TB/s", "mma.sync us");
    // An expert's weights (and, in fp8, its scales: one f32 per row per 128 values of k).
    const double expert_bytes = o.fp8 ? 3.0 * h * inter + 4.0 * (2.0 * inter * ((h + 127) / 128) + h * ((inter + 127) / 128))
                                      : 3.0 * h * inter * 2;
    const double fixed_bytes = 2.0 * E * h;
    for (int n : o.batches) {
      std::vector<float> x(static_cast<size_t>(n) * h);
      for (float& v : x) v = normal(rng);
      const Buffer d_x = upload_f32(x, dev);
      Buffer d_out(DType::f32, {static_cast<int64_t>(n) * h}, dev);
      size_t next = 0;
      const double seconds = cuda_median_seconds(
          [&] { layers[next++ % layers.size()]->forward(d_x.data_as<const float>(), d_out.data_as<float>(), n, step, nullptr); },
          30);
      // The experts this batch selects (the same in every layer: the weights differ, but a
      // synthetic router's picks are all that is counted here, from the last layer run).
      std::vector<int32_t> ids(static_cast<size_t>(n) * per_token);
      CUDA_CHECK(cudaDeviceSynchronize());
      CUDA_CHECK(cudaMemcpy(ids.data(), scratch.ws.slots[kMoeIds].data(), ids.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
      const size_t distinct = std::set<int32_t>(ids.begin(), ids.end()).size();  // the shared ones included
      const double bytes = static_cast<double>(distinct) * expert_bytes + fixed_bytes;
      const double ceiling = measure_cuda_read_tbps(dev, static_cast<size_t>(bytes), "cold");
      const double tbps = bytes / seconds / 1e12;
      // The last layer run left its routing in the scratch.
      const CudaMoe& last = *layers[(next - 1) % layers.size()];
      const double gemm_s = cuda_median_seconds([&] { last.grouped_gemms(n, scratch, nullptr); }, 30);
      const double gemm_tbps = static_cast<double>(distinct) * expert_bytes / gemm_s / 1e12;
      // The small tile on mma.sync too (what its warpgroup-MMA kernel replaced), in the same run.
      const bool small = ck::moe_pick_tile(static_cast<int64_t>(n) * per_token, stacked) == ck::MoeTile::kSmall;
      const double mma_s =
          small && !o.fp8
              ? cuda_median_seconds([&] { last.grouped_gemms(n, scratch, nullptr, CudaMoe::GemmVariant::mma_sync); }, 30)
              : 0.0;
      fmt::print("{:>7} {:>10.1f} {:>9} {:>9.1f} {:>10.2f} {:>10.2f} {:>7.2f} {:>10.1f} {:>10.2f} {:>10}\n", n,
                 seconds * 1e6, distinct, bytes / 1e6, tbps, ceiling, tbps / ceiling, gemm_s * 1e6, gemm_tbps,
                 mma_s > 0 ? fmt::format("{:.1f}", mma_s * 1e6) : std::string("-"));
      out.push_back({{"shape", shape}, {"tokens", n}, {"us", seconds * 1e6}, {"experts_read", distinct},
                     {"fp8", o.fp8}, {"bytes", bytes}, {"tbps", tbps}, {"ceiling_tbps", ceiling}, {"gemm_us", gemm_s * 1e6},
                     {"mma_sync_gemm_us", mma_s * 1e6}});
    }

    // Prefill: the whole layer, then its two grouped GEMMs alone (over the routing the layer's
    // run left in the scratch), then cuBLAS on the same FLOPs as two dense bf16 GEMMs.
    const int n = o.prefill;
    const int64_t pairs = static_cast<int64_t>(n) * per_token;
    std::vector<float> x(static_cast<size_t>(n) * h);
    for (float& v : x) v = normal(rng);
    const Buffer d_x = upload_f32(x, dev);
    Buffer d_out(DType::f32, {static_cast<int64_t>(n) * h}, dev);
    const double layer_s = cuda_median_seconds(
        [&] { layers[0]->forward(d_x.data_as<const float>(), d_out.data_as<float>(), n, step, nullptr); }, 10);
    const int bm = ck::moe_tile_rows(ck::moe_pick_tile(pairs, stacked));
    using Variant = CudaMoe::GemmVariant;
    auto gemms = [&](Variant v) { return cuda_median_seconds([&] { layers[0]->grouped_gemms(n, scratch, nullptr, v); }, 10); };
    const double gemm_s = gemms(Variant::automatic);
    // The kernels the large tile compares with, in the same run: mma.sync (what warpgroup MMA
    // replaced), unpaired blocks and, with bf16 weights, bf16 activations (what peers multiply;
    // not the engine's). Smaller tiles run mma.sync alone: nothing to compare.
    const bool large = ck::moe_pick_tile(pairs, stacked) == ck::MoeTile::kLarge;
    const double mma_sync_s = large ? gemms(Variant::mma_sync) : 0.0;
    const double unpaired_s = large ? gemms(Variant::unpaired) : 0.0;
    const double bf16_s = large && !o.fp8 ? gemms(Variant::bf16_activations) : 0.0;
    Buffer a(DType::bf16, {2 * pairs, std::max(h, inter)}, dev), b(DType::bf16, {2 * inter, h}, dev),
        c(DType::bf16, {2 * pairs, std::max(2 * inter, h)}, dev);
    CUDA_CHECK(cudaMemset(a.data(), 0x3c, a.nbytes()));
    CUDA_CHECK(cudaMemset(b.data(), 0x3c, b.nbytes()));
    // cuBLAS over `rows` rows: pairs (the useful FLOPs) or 2 pairs (the hi and lo rows stacked, the
    // tensor-core work of specula's f32-accurate products, as its dense layers run them).
    auto cublas = [&](int64_t rows) {
      return cuda_median_seconds(
          [&] {
            linear.batched_bf16({a.data(), h, 0}, {b.data(), h, 0}, c.data(), 2 * inter, 0, rows, h, 2 * inter, 1);
            linear.batched_bf16({a.data(), inter, 0}, {b.data(), inter, 0}, c.data(), h, 0, rows, inter, h, 1);
          },
          10);
    };
    const double cublas_s = cublas(pairs), cublas_split_s = cublas(2 * pairs);
    const double flops = 2.0 * static_cast<double>(pairs) * h * 3.0 * inter;
    auto tflops = [&](double seconds) { return seconds > 0 ? flops / seconds / 1e12 : 0.0; };
    fmt::print("prefill {} tokens ({} tile), useful TFLOP/s (tensor-core work is twice that with the hi + lo split):\n",
               n, bm);
    fmt::print("  layer                              {:>8.0f} us {:>6.0f} TFLOP/s\n", layer_s * 1e6, tflops(layer_s));
    fmt::print("  grouped GEMMs, hi + lo             {:>8.0f} us {:>6.0f} TFLOP/s  {:.2f} of cuBLAS hi + lo, {:.2f} of "
               "cuBLAS bf16\n",
               gemm_s * 1e6, tflops(gemm_s), cublas_split_s / gemm_s, cublas_s / gemm_s);
    if (large) {
      fmt::print("  grouped GEMMs, mma.sync, hi + lo   {:>8.0f} us {:>6.0f} TFLOP/s  {:.2f} of cuBLAS hi + lo\n",
                 mma_sync_s * 1e6, tflops(mma_sync_s), cublas_split_s / mma_sync_s);
      fmt::print("  grouped GEMMs, unpaired blocks     {:>8.0f} us {:>6.0f} TFLOP/s  {:.2f} of cuBLAS hi + lo\n",
                 unpaired_s * 1e6, tflops(unpaired_s), cublas_split_s / unpaired_s);
    }
    if (large && !o.fp8) {
      fmt::print("  grouped GEMMs, bf16 activations    {:>8.0f} us {:>6.0f} TFLOP/s  {:.2f} of cuBLAS bf16\n", bf16_s * 1e6,
                 tflops(bf16_s), cublas_s / bf16_s);
    }
    fmt::print("  cuBLAS bf16, same FLOPs            {:>8.0f} us {:>6.0f} TFLOP/s\n", cublas_s * 1e6, tflops(cublas_s));
    fmt::print("  cuBLAS bf16 over hi + lo rows      {:>8.0f} us {:>6.0f} TFLOP/s useful ({:.0f} on tensor cores)\n",
               cublas_split_s * 1e6, tflops(cublas_split_s), 2 * tflops(cublas_split_s));
    out.push_back({{"shape", shape}, {"prefill_tokens", n}, {"layer_us", layer_s * 1e6}, {"gemm_us", gemm_s * 1e6},
                   {"gemm_mma_sync_us", mma_sync_s * 1e6}, {"gemm_unpaired_us", unpaired_s * 1e6},
                   {"gemm_bf16_activations_us", bf16_s * 1e6},
                   {"cublas_us", cublas_s * 1e6}, {"cublas_hi_lo_us", cublas_split_s * 1e6},
                   {"gemm_tflops", tflops(gemm_s)}, {"cublas_tflops", tflops(cublas_s)},
                   {"gemm_ceiling_tflops", ceilings.gemm_tflops}});
  }
  if (!o.json_path.empty()) write_json_file(o.json_path, out);
}
#else
void run(const Options& o) {
  check_flags(o);
  SPECULA_CHECK(false, "bench moe needs a CUDA build");
}
#endif

}  // namespace

void add_bench_moe_command(CLI::App& bench) {
  auto o = std::make_shared<Options>();
  CLI::App* cmd = bench.add_subcommand("moe", "Time the GPU mixture-of-experts layer on real model shapes");
  cmd->add_option("--shape", o->shapes, "Synthetic model shapes with experts")->delimiter(',')->capture_default_str();
  cmd->add_option("--batches", o->batches, "Decode batch sizes (tokens)")->delimiter(',')->capture_default_str();
  cmd->add_option("--prefill", o->prefill, "Tokens of the prefill case")->capture_default_str();
  cmd->add_option("--layers", o->layers, "Layers built and cycled through (each timed call finds a cold L2)")
      ->capture_default_str();
  cmd->add_flag("--fp8", o->fp8, "Experts in fp8 e4m3 with 128 x 128 block scales (DeepSeek-V3's layout)");
  cmd->add_option("--json", o->json_path, "Also write the results to this JSON file");
  cmd->callback([o] { run(*o); });
}

}  // namespace specula
