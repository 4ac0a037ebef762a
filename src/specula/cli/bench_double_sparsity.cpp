#include "specula/cli/bench_double_sparsity.h"

#include <fmt/format.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <vector>

#include "specula/attention/double_sparsity/ds_backend.h"
#include "specula/cli/attention_bench_case.h"
#include "specula/cli/json_file.h"
#include "specula/core/error.h"
#ifdef SPECULA_HAS_CUDA
#include "specula/cli/cuda_ceilings.h"
#include "specula/cli/cuda_timing.h"
#endif

namespace specula {

int run_ds_bench(const DsBenchOptions& o) {
#ifndef SPECULA_HAS_CUDA
  SPECULA_CHECK(false, "bench attention --double-sparsity needs a CUDA build and device");
  return 1;
#else
  check_json_path(o.json_path);
  const Device device = parse_device(o.device);
  SPECULA_CHECK(device.is_cuda() && cuda_available(), "bench attention --double-sparsity needs a CUDA device, not {}",
                o.device);
  SPECULA_CHECK(o.token_fraction >= 2, "--ds-token-fraction {} must be >= 2", o.token_fraction);
  SPECULA_CHECK(o.heavy_channel_num >= 1 && o.heavy_channel_num <= 128,
                "--ds-heavy-channel-num {} is out of range; allowed 1 to 128 (head_dim)", o.heavy_channel_num);
  const L2Start l2 = parse_l2_start(o.l2);
  const CudaCeilings ceilings = measure_cuda_ceilings(device);

  struct Case {
    int batch, len, layers;
  };
  const std::vector<Case> cases = {{1, 32768, 1}, {1, 32768, 8}, {8, 32768, 1}, {32, 32768, 1}, {1, 131072, 1}};
  struct Row {
    std::string name;
    double dense_s = 0, sparse_s = 0, dense_bytes = 0, sparse_bytes = 0;
    int heavy = 0;
  };
  std::vector<Row> rows;
  for (const Case& k : cases) {
    AttentionBenchCase c;
    c.name = fmt::format("decode B={} L={} p16{}", k.batch, k.len, k.layers > 1 ? " x8 layers" : "");
    if (!o.filter.empty() && c.name.find(o.filter) == std::string::npos) continue;
    c.mode = ForwardMode::DECODE;
    c.batch_size = k.batch;
    c.prefix_len = k.len - 1;
    c.page_size = 16;
    c.layers = k.layers;

    auto config = std::make_shared<DoubleSparsityConfig>();
    config->heavy_channel_num = o.heavy_channel_num;
    config->heavy_token_num = k.len / o.token_fraction;
    config->sparse_decode_threshold = 4096;
    for (int l = 0; l < k.layers; ++l) {
      // Distinct channels per head (a rotation of 0..head_dim-1): which ones does not change the
      // traffic being timed.
      std::vector<int32_t>& ch = config->channels.emplace_back();
      for (int h = 0; h < c.num_kv_heads; ++h) {
        for (int i = 0; i < o.heavy_channel_num; ++i) ch.push_back((i + 7 * h) % c.head_dim);
      }
    }
    AttentionBackendOptions bo;
    bo.device = device;
    bo.page_size = c.page_size;
    bo.max_context_len = k.len;
    Row row;
    row.name = c.name;
    row.heavy = config->heavy_token_num;
    {
      auto dense = make_attention_backend("cuda", bo);
      AttentionBenchSetup setup(c, *dense, device);
      setup.init_metadata();
      row.dense_s = cuda_median_seconds([&] { for (int l = 0; l < k.layers; ++l) setup.run_layer(l); }, 30, 3, l2) / k.layers;
      row.dense_bytes = setup.kv_bytes_read();
    }
    bo.double_sparsity = config;
    auto backend = make_attention_backend("cuda", bo);
    auto* ds = dynamic_cast<DoubleSparsityBackend*>(backend.get());
    SPECULA_ASSERT(ds != nullptr);
    AttentionBenchSetup setup(c, *backend, device);
    const std::vector<int32_t> slots = setup.cached_slots();
    for (int l = 0; l < k.layers; ++l) {
      AttentionLayer layer = setup.layer();
      layer.layer_id = l;
      ds->label_slots(layer, setup.kv_pool(), slots);
    }
    setup.init_metadata();
    SPECULA_CHECK(ds->sparse_step(), "bench case {} did not go sparse", c.name);
    row.sparse_s = cuda_median_seconds([&] { for (int l = 0; l < k.layers; ++l) setup.run_layer(l); }, 30, 3, l2) / k.layers;
    // What the sparse decode must read: every key's labels, then the chosen keys' K and V rows.
    row.sparse_bytes = static_cast<double>(k.batch) * c.num_kv_heads *
                       (static_cast<double>(k.len) * o.heavy_channel_num * 2 + 2.0 * row.heavy * c.head_dim * 2);
    rows.push_back(row);
  }

  fmt::print("specula bench attention --double-sparsity  device={} l2={}\n", device.str(), o.l2);
  fmt::print("ceilings measured now: {}: device copy {:.2f} TB/s (read + written)\n", ceilings.device_name,
             ceilings.copy_tbps);
  fmt::print("32 query / 8 KV heads, head_dim 128, bf16 KV in pages of 16; {} label channels per KV head, heavy "
             "tokens = context / {}; one layer per call (x8 layers: back to back, per layer)\n\n",
             o.heavy_channel_num, o.token_fraction);
  fmt::print("{:<30} {:>7} {:>10} {:>10} {:>9} {:>12} {:>14}\n", "case", "heavy", "dense ms", "sparse ms", "speed-up",
             "dense TB/s", "sparse TB/s*");
  nlohmann::json j;
  for (const Row& r : rows) {
    fmt::print("{:<30} {:>7} {:>10.4f} {:>10.4f} {:>8.2f}x {:>12.2f} {:>14.2f}\n", r.name, r.heavy, r.dense_s * 1e3,
               r.sparse_s * 1e3, r.dense_s / r.sparse_s, r.dense_bytes / r.dense_s / 1e12,
               r.sparse_bytes / r.sparse_s / 1e12);
    j["results"].push_back({{"case", r.name},
                            {"heavy_token_num", r.heavy},
                            {"dense_seconds", r.dense_s},
                            {"sparse_seconds", r.sparse_s},
                            {"speedup", r.dense_s / r.sparse_s},
                            {"dense_bytes", r.dense_bytes},
                            {"sparse_bytes", r.sparse_bytes}});
  }
  fmt::print("\n* labels of every key plus the chosen keys' K and V, per second\n");
  if (!o.json_path.empty()) {
    j["device"] = device.str();
    j["copy_tbps"] = ceilings.copy_tbps;
    j["heavy_channel_num"] = o.heavy_channel_num;
    write_json_file(o.json_path, j);
    fmt::print("wrote {}\n", o.json_path);
  }
  return 0;
#endif
}

}  // namespace specula
