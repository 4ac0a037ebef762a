// The MLA benchmark: builds paged latent caches filled with random rows, a batch per case, and
// times one layer's attention call (the cache write excluded) with CUDA events.
#include "specula/cli/bench_mla.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <numeric>
#include <cmath>
#include <random>
#include <vector>

#include "specula/attention/mla/mla_backend.h"
#include "specula/cli/json_file.h"
#include "specula/core/error.h"
#include "specula/kv/mla_kv_pool.h"
#include "specula/kv/req_to_token_pool.h"

#ifdef SPECULA_HAS_CUDA
#include "specula/cli/cuda_ceilings.h"
#include "specula/cli/cuda_timing.h"
#include "specula/model/cuda/cuda_linear.h"
#include "specula/model/cuda/mla_expand.h"
#endif

namespace specula {

namespace {

struct MlaBenchCase {
  std::string name;
  int batch_size = 128;
  int num_q_heads = 128;
  int seq_len = 4096;  // committed keys per request
  int q_len = 1;       // 1: DECODE; > 1: TARGET_VERIFY, causal (MTP), or EXTEND with `extend`
  bool extend = false;  // q_len new tokens after seq_len cached ones (absorbed prefill)
  MlaKVFormat format = MlaKVFormat::bf16;
  int topk = 0;        // > 0: sparse
  bool indexer = false;  // time the lightning indexer (64 heads x 128) instead of attention
  // Extend in the expanded form (forward_expanded at 192 / 128), kv_b_proj's sgemm and the K/V
  // packing included; expand_nothing: without them (the gather, the attention and the merges).
  bool expanded = false;
  bool expand_nothing = false;
};

struct MlaBenchResult {
  MlaBenchCase c;
  double seconds = 0;
  double tbps = 0;     // unique cache bytes read
  double tflops = 0;
};

#ifdef SPECULA_HAS_CUDA
MlaBenchResult time_case(const MlaBenchCase& c, Device device, L2Start l2) {
  constexpr int kPage = 64;
  constexpr int kIndexHeads = 64;
  constexpr int kIndexDim = 128;
  const int kv_len = c.seq_len + c.q_len;
  const int pages_per_req = (kv_len + kPage - 1) / kPage;
  MLAKVPoolConfig pc;
  pc.num_slots = (static_cast<int64_t>(c.batch_size) * pages_per_req + 1) * kPage;
  pc.num_layers = 1;
  pc.format = c.format;
  pc.index_head_dim = c.indexer ? kIndexDim : 0;
  pc.device = device;
  MLAKVPool pool(pc);
  ReqToTokenPool req_pool(c.batch_size, pages_per_req * kPage);
  std::mt19937_64 rng(1234);
  // Every slot gets a random row: a block of distinct rows, written over and over.
  {
    constexpr int64_t kRows = 32768;
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> kv(kRows * 512), pe(kRows * 64), ik(c.indexer ? kRows * kIndexDim : 0);
    for (float& x : kv) x = normal(rng);
    for (float& x : pe) x = normal(rng);
    for (float& x : ik) x = normal(rng);
    Buffer dkv(DType::f32, {kRows, 512}, device), dpe(DType::f32, {kRows, 64}, device);
    copy(dkv, TensorView(kv.data(), DType::f32, {kRows, 512}));
    copy(dpe, TensorView(pe.data(), DType::f32, {kRows, 64}));
    Buffer dik;
    if (c.indexer) {
      dik = Buffer(DType::f32, {kRows, kIndexDim}, device);
      copy(dik, TensorView(ik.data(), DType::f32, {kRows, kIndexDim}));
    }
    Buffer loc(DType::i32, {kRows}, device);
    std::vector<int32_t> slots(kRows);
    for (int64_t start = 0; start < pc.num_slots; start += kRows) {
      const int64_t count = std::min(kRows, pc.num_slots - start);
      std::iota(slots.begin(), slots.begin() + count, static_cast<int32_t>(start));
      copy(loc.view().slice(0, count), TensorView(slots.data(), DType::i32, {count}));
      pool.set_mla_kv_buffer(0, loc.view().slice(0, count), dkv.view().slice(0, count), dpe.view().slice(0, count), nullptr);
      if (c.indexer) pool.set_index_k(0, loc.view().slice(0, count), dik.view().slice(0, count), nullptr);
    }
  }
  // Requests own shuffled pages.
  std::vector<int32_t> page_ids(static_cast<size_t>(c.batch_size) * static_cast<size_t>(pages_per_req));
  std::iota(page_ids.begin(), page_ids.end(), 1);
  std::shuffle(page_ids.begin(), page_ids.end(), rng);
  ForwardBatch batch;
  batch.forward_mode = c.extend       ? ForwardMode::EXTEND
                       : c.q_len == 1 ? ForwardMode::DECODE
                                      : ForwardMode::TARGET_VERIFY;
  batch.batch_size = c.batch_size;
  batch.req_to_token_pool = &req_pool;
  batch.mla_kv_pool = &pool;
  if (c.q_len > 1 && !c.extend) {
    auto spec = std::make_shared<SpecInfo>();
    spec->num_draft_tokens = c.q_len;
    batch.spec_info = spec;
  }
  const auto rows = req_pool.alloc(c.batch_size).value();
  for (int i = 0; i < c.batch_size; ++i) {
    std::vector<int32_t> slots(static_cast<size_t>(kv_len));
    for (int j = 0; j < kv_len; ++j) {
      slots[static_cast<size_t>(j)] = page_ids[static_cast<size_t>(i * pages_per_req + j / kPage)] * kPage + j % kPage;
    }
    req_pool.write(rows[static_cast<size_t>(i)], 0, slots);
    batch.req_pool_indices.push_back(rows[static_cast<size_t>(i)]);
    batch.seq_lens.push_back(c.q_len == 1 || c.extend ? kv_len : c.seq_len);
    if (c.extend) {
      batch.extend_prefix_lens.push_back(c.seq_len);
      batch.extend_seq_lens.push_back(c.q_len);
    }
    for (int j = kv_len - c.q_len; j < kv_len; ++j) {
      batch.out_cache_loc.push_back(slots[static_cast<size_t>(j)]);
      batch.input_ids.push_back(1);
      batch.positions.push_back(j);
    }
  }
  const int64_t n = batch.num_tokens();
  MlaBackendOptions bo;
  bo.device = device;
  bo.page_size = kPage;
  bo.max_context_len = pages_per_req * kPage;
  bo.extend_form = c.expanded ? MlaExtendForm::expanded : MlaExtendForm::absorbed;
  auto backend = make_mla_backend("cuda", bo);
  MlaLayer layer;
  layer.num_q_heads = c.num_q_heads;
  layer.scaling = 1.0f / std::sqrt(192.0f);
  backend->check_layer(layer, DType::bf16, c.format);
  backend->init_forward_metadata(batch);

  auto random_device_bf16 = [&](Shape shape) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> host(static_cast<size_t>(shape.numel()));
    for (float& x : host) x = normal(rng);
    Buffer b(DType::bf16, shape, device);
    Buffer h(DType::bf16, shape);
    convert_from_float(host.data(), h.data(), DType::bf16, host.size());
    copy(b, h);
    return b;
  };
  MlaBenchResult r;
  r.c = c;
  if (c.indexer) {
    const Buffer q = random_device_bf16({n, kIndexHeads, kIndexDim});
    std::vector<float> w(static_cast<size_t>(n * kIndexHeads));
    std::uniform_real_distribution<float> uni(0.0f, 1.0f);
    for (float& x : w) x = uni(rng);
    Buffer weights(DType::f32, {n, kIndexHeads}, device);
    copy(weights, TensorView(w.data(), DType::f32, {n, kIndexHeads}));
    Buffer out(DType::i32, {n, c.topk}, device);
    r.seconds = cuda_median_seconds([&] { backend->indexer_topk(q, weights, TensorView(), layer, batch, out, false); }, 20, 2, l2);
    r.tflops = 2.0 * static_cast<double>(n) * kv_len * kIndexHeads * kIndexDim / r.seconds * 1e-12;
    r.tbps = static_cast<double>(c.batch_size) * kv_len * (kIndexDim + 4) / r.seconds * 1e-12;
    return r;
  }
  if (c.expanded) {
    constexpr int kNope = 128, kV = 128, kRope = 64;
    const int H = c.num_q_heads;
    const Buffer q = random_device_bf16({n, H, kNope + kRope});
    Buffer out(DType::bf16, {n, H, kV}, device);
    // kv_b_proj as DeepseekCudaModel's expanded form holds it: bf16 [H (nope + v), 512], and the
    // same products.
    std::vector<float> w(static_cast<size_t>(H) * (kNope + kV) * 512);
    std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt(512.0f));
    for (float& x : w) x = normal(rng);
    const Buffer wkv_b = upload_bf16(w, device);
    const CudaLinear linear(device, nullptr, false);
    const MlaExpandFn expand = [&](const void* kv_c, const void* k_pe, int64_t rows, void* k, void* v) {
      if (!c.expand_nothing) expand_mla_rows(linear, wkv_b.data(), kv_c, k_pe, rows, H, 512, kNope, kRope, kV, k, v, nullptr);
    };
    MlaForwardOptions fo;
    fo.save_kv_cache = false;
    const TensorView none;
    r.seconds = cuda_median_seconds([&] { backend->forward_expanded(q, none, none, out, layer, batch, expand, fo); },
                                    20, 2, l2);
    const double keys_per_token = c.seq_len + (c.q_len + 1) / 2.0;
    r.tflops = 2.0 * (kNope + kRope + kV) * static_cast<double>(n) * H * keys_per_token / r.seconds * 1e-12;
    r.tbps = static_cast<double>(c.batch_size) * kv_len * static_cast<double>(pool.row_bytes()) / r.seconds * 1e-12;
    return r;
  }
  const Buffer q = random_device_bf16({n, c.num_q_heads, 576});
  Buffer out(DType::bf16, {n, c.num_q_heads, 512}, device);
  MlaForwardOptions fo;
  fo.save_kv_cache = false;
  Buffer topk;
  double keys_per_token = 0;
  if (c.topk > 0) {
    std::vector<int32_t> idx(static_cast<size_t>(n * c.topk));
    std::vector<int32_t> pos(static_cast<size_t>(kv_len));
    std::iota(pos.begin(), pos.end(), 0);
    for (int64_t t = 0; t < n; ++t) {
      std::shuffle(pos.begin(), pos.end(), rng);
      std::copy(pos.begin(), pos.begin() + c.topk, idx.begin() + t * c.topk);
    }
    topk = Buffer(DType::i32, {n, c.topk}, device);
    copy(topk, TensorView(idx.data(), DType::i32, {n, c.topk}));
    fo.topk_indices = topk;
    keys_per_token = c.topk;
  } else {
    keys_per_token = c.seq_len + (c.q_len + 1) / 2.0;  // causal: the mean visible keys
  }
  const TensorView none;
  r.seconds = cuda_median_seconds([&] { backend->forward(q, none, none, out, layer, batch, fo); }, 20, 2, l2);
  r.tflops = 2.0 * (576 + 512) * static_cast<double>(n) * c.num_q_heads * keys_per_token / r.seconds * 1e-12;
  const double rows_read = c.topk > 0 ? static_cast<double>(n) * c.topk : static_cast<double>(c.batch_size) * kv_len;
  r.tbps = rows_read * static_cast<double>(pool.row_bytes()) / r.seconds * 1e-12;
  return r;
}
#endif

}  // namespace

int run_mla_bench(const MlaBenchOptions& o) {
  const Device device = parse_device(o.device);
  SPECULA_CHECK(device.is_cuda(), "bench attention --mla runs on a CUDA device, not {}", device.str());
  SPECULA_CHECK(cuda_available(), "bench attention --mla needs a CUDA GPU; this build or machine has none");
  check_json_path(o.json_path);
#ifdef SPECULA_HAS_CUDA
  const L2Start l2 = parse_l2_start(o.l2);
  const CudaCeilings ceilings = measure_cuda_ceilings(device);
  std::vector<MlaBenchCase> cases;
  auto add = [&](std::string name, int heads, int q_len, MlaKVFormat fmt, int topk, bool indexer = false,
                 int batch_size = 128, int seq_len = 4096, bool extend = false, int expanded = 0) {
    MlaBenchCase c;
    c.name = std::move(name);
    c.num_q_heads = heads;
    c.q_len = q_len;
    c.format = fmt;
    c.topk = topk;
    c.indexer = indexer;
    c.batch_size = batch_size;
    c.seq_len = seq_len;
    c.extend = extend;
    c.expanded = expanded > 0;
    c.expand_nothing = expanded == 2;
    cases.push_back(c);
  };
  add("dense bf16 h128 q1 L4096", 128, 1, MlaKVFormat::bf16, 0);
  add("dense bf16 h128 q2 L4096", 128, 2, MlaKVFormat::bf16, 0);
  add("dense bf16 h16 q1 L4096", 16, 1, MlaKVFormat::bf16, 0);
  // The same step over 16384 keys: a block's fixed costs (its first tiles, Q, the output) spread
  // over four times the tiles.
  add("dense bf16 h128 q1 L16384", 128, 1, MlaKVFormat::bf16, 0, false, 128, 16384);
  add("dense fp8 h128 q1 L4096", 128, 1, MlaKVFormat::fp8_ds_mla, 0);
  add("sparse fp8 h128 q2 topk2048", 128, 2, MlaKVFormat::fp8_ds_mla, 2048);
  add("sparse bf16 h128 q2 topk2048", 128, 2, MlaKVFormat::bf16, 2048);
  add("indexer h64 q2 L4096 topk2048", 128, 2, MlaKVFormat::fp8_ds_mla, 2048, true);
  // Prefill in both forms: absorbed (576 + 512 wide), and expanded (per-head K/V from kv_b_proj,
  // 192 + 128 wide; "attn" rows leave out kv_b_proj's sgemm and the packing). The expanded rows
  // count 2 x (192 + 128) FLOPs per head per key; compare the forms by ms/call.
  for (int heads : {16, 128}) {
    for (int prefix : {0, 4096}) {
      const std::string shape = fmt::format("h{} B1 P{} S4096", heads, prefix);
      add("extend absorbed " + shape, heads, 4096, MlaKVFormat::bf16, 0, false, 1, prefix, true);
      add("extend expanded " + shape, heads, 4096, MlaKVFormat::bf16, 0, false, 1, prefix, true, 1);
      add("extend expanded attn " + shape, heads, 4096, MlaKVFormat::bf16, 0, false, 1, prefix, true, 2);
    }
  }
  std::vector<MlaBenchResult> results;
  for (const MlaBenchCase& c : cases) {
    if (!o.filter.empty() && c.name.find(o.filter) == std::string::npos) continue;
    results.push_back(time_case(c, device, l2));
  }
  fmt::print("specula bench attention --mla  device={}\n", device.str());
  fmt::print("ceilings measured now: {}: device copy {:.2f} TB/s (read + written), bf16 cuBLAS GEMM {:.0f} TFLOP/s\n",
             ceilings.device_name, ceilings.copy_tbps, ceilings.gemm_tflops);
  fmt::print("B=128, page 64, kv_lora_rank 512 + rope 64, one layer per call; FLOPs 2 x (576 + 512) per head per key; "
             "L2 {} at each call's start\n\n",
             o.l2);
  fmt::print("{:<38} {:>9} {:>9} {:>8} {:>9} {:>8}\n", "case", "ms/call", "TB/s", "of copy", "TFLOP/s", "of gemm");
  for (const MlaBenchResult& r : results) {
    fmt::print("{:<38} {:>9.3f} {:>9.2f} {:>7.0f}% {:>9.1f} {:>7.0f}%\n", r.c.name, r.seconds * 1e3, r.tbps,
               100 * r.tbps / ceilings.copy_tbps, r.tflops, 100 * r.tflops / ceilings.gemm_tflops);
  }
  if (!o.json_path.empty()) {
    nlohmann::json j;
    j["device"] = device.str();
    j["l2_start"] = o.l2;
    j["ceilings"] = {{"copy_tbps", ceilings.copy_tbps}, {"gemm_tflops", ceilings.gemm_tflops}};
    for (const MlaBenchResult& r : results) {
      j["results"].push_back({{"case", r.c.name}, {"seconds_per_call", r.seconds}, {"tbps", r.tbps}, {"tflops", r.tflops}});
    }
    write_json_file(o.json_path, j);
  }
  return 0;
#else
  return 1;
#endif
}

}  // namespace specula
