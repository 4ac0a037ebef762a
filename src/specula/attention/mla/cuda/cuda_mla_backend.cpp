// CudaMlaBackend: per-step planning on the host (work items, splits, tree bits, page table), one
// batched upload per step into device arrays (frozen for CUDA graphs, growable otherwise), the
// cache write, sparse index conversion, and the attention / combine launches.
#include "specula/attention/mla/cuda/cuda_mla_backend.h"

#include <algorithm>
#include <cmath>

#include "specula/attention/metadata.h"
#include "specula/attention/mla/cuda/kernels/indexer.h"
#include "specula/attention/mla/cuda/kernels/mla_attention.h"
#include "specula/attention/mla/cuda/kernels/sparse_indices.h"
#include "specula/attention/mla/cuda/mla_expanded.h"
#include "specula/core/cuda_check.h"
#include "specula/core/device_array.h"
#include "specula/core/error.h"
#include "specula/core/upload_batch.h"
#include "specula/kv/req_to_token_pool.h"

namespace specula {

namespace ck = cuda_kernels;

bool prefer_expanded(const std::vector<int32_t>& kv_lens, const std::vector<int32_t>& q_lens, int qk_nope_head_dim,
                     int v_head_dim) {
  // TFLOP/s: the absorbed MLA kernel's extend rows, the 192 / 128 MHA kernel's (gather included),
  // the model's f32 W_UK / W_UV sgemms, and the expanded form's bf16 kv_b_proj GEMMs.
  constexpr double kAbsorbedRate = 510, kExpandedRate = 450, kF32Rate = 39, kBf16Rate = 450;
  const double product = 2.0 * ck::kMlaLoraRank * (qk_nope_head_dim + v_head_dim);  // per token or row
  double pairs = 0, tokens = 0, rows = 0;
  for (size_t i = 0; i < kv_lens.size(); ++i) {
    const double q = q_lens[i], prefix = kv_lens[i] - q_lens[i];
    pairs += q * prefix + q * (q + 1) / 2;
    tokens += q;
    rows += kv_lens[i];
  }
  const double absorbed = pairs * 2.0 * (2 * ck::kMlaLoraRank + ck::kMlaRopeDim) / kAbsorbedRate + tokens * product / kF32Rate;
  const double expanded = pairs * 2.0 * (qk_nope_head_dim + ck::kMlaRopeDim + v_head_dim) / kExpandedRate +
                          rows * product / kBf16Rate;
  return expanded < absorbed;
}

int choose_mla_splits(int64_t base_items, int max_keys, int num_sms, int chunk_tokens) {
  int splits = 1;
  if (base_items > 0 && base_items < num_sms) {
    const int64_t want = (2 * static_cast<int64_t>(num_sms) + base_items - 1) / base_items;
    const int64_t cap = std::max<int64_t>(1, max_keys / 64);
    splits = static_cast<int>(std::min<int64_t>({want, cap, 64}));
  }
  if (chunk_tokens > 0) splits = std::max(splits, (max_keys + chunk_tokens - 1) / chunk_tokens);
  return std::max(splits, 1);
}

namespace {

// Sparse steps inside CUDA graphs convert at most this many indices per token (DeepSeek-V3.2's
// index_topk); the slot buffer is sized for it before capture.
constexpr int64_t kMaxGraphTopk = 2048;

struct DeviceSet {
  DeviceArray<int32_t> page_table, kv_lens, q_lens, first_token, items, num_items, loc, token_req, slots;
  DeviceArray<uint64_t> tree_bits;
  DeviceArray<float> part_o, part_lse;
  DeviceArray<int32_t> token_pos;  // the lightning indexer
  DeviceArray<float> scores;
  bool fixed = false;  // the graph set: sized once, frozen
};

}  // namespace

struct CudaMlaBackend::State {
  DeviceSet eager;
  DeviceSet graph;
  DeviceSet* active = &eager;
  bool graph_ready = false;
  int graph_max_bs = 0;
  int graph_max_tokens = 0;
  // The step's plan.
  const ForwardBatch* batch = nullptr;
  ForwardMode mode = ForwardMode::IDLE;
  int64_t num_tokens = 0;
  int batch_size = 0;
  int max_pages = 0;
  int max_kv = 0;
  int dense_splits = 1;
  int dense_items = 0;
  bool tree = false;
  int graph_tree = -1;  // whether captured graphs attend with tree bits (-1: nothing captured)
  std::vector<int32_t> token_req;  // host copies, for planning
  std::vector<int32_t> token_pos;
  bool expanded = false;  // this step runs forward_expanded
  std::unique_ptr<MlaExpandedPass> expanded_pass;
  std::map<int, std::pair<std::vector<float>, Buffer>> sinks;
  UploadBatch uploads{Device::cpu()};  // the step's metadata, flushed once per build_metadata
  cudaStream_t stream = nullptr;
};

CudaMlaBackend::CudaMlaBackend(const MlaBackendOptions& options) : options_(options), state_(std::make_unique<State>()) {
  SPECULA_CHECK(options.device.is_cuda(), "the cuda MLA backend needs a CUDA device, not {}", options.device.str());
  SPECULA_CHECK(options.page_size >= 1, "page_size {} is not valid; it must be >= 1", options.page_size);
  SPECULA_CHECK(options.prefix_chunk_tokens >= 0, "prefix_chunk_tokens {} must be >= 0 (0: no chunking)",
                options.prefix_chunk_tokens);
  SPECULA_CHECK(options.expanded_chunk_rows >= 0, "expanded_chunk_rows {} must be >= 0 (0: sized from the heads)",
                options.expanded_chunk_rows);
  CUDA_CHECK(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, options.device.index));
  state_->stream = static_cast<cudaStream_t>(options.cuda_stream);
  state_->uploads = UploadBatch(options.device);
  int l2 = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, options.device.index));
  state_->expanded_pass = std::make_unique<MlaExpandedPass>(options.device, state_->stream, l2);
}

CudaMlaBackend::~CudaMlaBackend() = default;

void CudaMlaBackend::check_layer(const MlaLayer& layer, DType q_dtype, MlaKVFormat kv_format) const {
  const std::string problem = common_mla_layer_problem(layer);
  SPECULA_CHECK(problem.empty(), "cuda MLA backend cannot serve layer {}: {}", layer.layer_id, problem);
  SPECULA_CHECK(layer.kv_lora_rank == ck::kMlaLoraRank && layer.qk_rope_head_dim == ck::kMlaRopeDim,
                "cuda MLA backend: layer {} has kv_lora_rank {} and qk_rope_head_dim {}; supported: {} and {}",
                layer.layer_id, layer.kv_lora_rank, layer.qk_rope_head_dim, ck::kMlaLoraRank, ck::kMlaRopeDim);
  SPECULA_CHECK(q_dtype == DType::bf16, "cuda MLA backend: query dtype {} is not supported; supported: bf16",
                dtype_name(q_dtype));
  (void)kv_format;  // both formats are served
  SPECULA_CHECK(num_q_heads_ == 0 || num_q_heads_ == layer.num_q_heads,
                "cuda MLA backend: layer {} has {} query heads but an earlier layer had {}; one backend serves one "
                "head count", layer.layer_id, layer.num_q_heads, num_q_heads_);
  num_q_heads_ = layer.num_q_heads;
  widths_.qk_nope_head_dim = layer.qk_nope_head_dim;
  widths_.v_head_dim = layer.v_head_dim;
  widths_.qk_rope_head_dim = layer.qk_rope_head_dim;
  expanded_problem_ = expanded_layer_problem(layer);
  SPECULA_CHECK(options_.extend_form != MlaExtendForm::expanded || expanded_problem_.empty(),
                "cuda MLA backend: layer {} cannot run extend in the expanded form: {}", layer.layer_id,
                expanded_problem_);
  // Sinks go to the device here, at start-up: forward may be running inside a graph capture.
  if (!layer.sinks.empty()) {
    auto& [values, buffer] = state_->sinks[layer.layer_id];
    if (values != layer.sinks) {
      values = layer.sinks;
      buffer = Buffer(DType::f32, {layer.num_q_heads}, options_.device);
      copy(buffer, TensorView(values.data(), DType::f32, {layer.num_q_heads}));
    }
  }
}

void CudaMlaBackend::init_forward_metadata(const ForwardBatch& batch) { build_metadata(batch, false); }

void CudaMlaBackend::init_cuda_graph_state(int max_bs, int max_num_tokens) {
  SPECULA_CHECK(max_bs >= 1 && max_num_tokens >= max_bs, "init_cuda_graph_state: max_bs {} and max_num_tokens {} "
                "must be >= 1 with max_num_tokens >= max_bs", max_bs, max_num_tokens);
  SPECULA_CHECK(options_.max_context_len > 0, "the cuda MLA backend needs max_context_len for CUDA graphs");
  SPECULA_CHECK(num_q_heads_ > 0, "check_layer must see the model's layers before init_cuda_graph_state");
  State& st = *state_;
  const Device dev = options_.device;
  DeviceSet& g = st.graph;
  const int H = num_q_heads_;
  const int per_req = (max_num_tokens + max_bs - 1) / max_bs;
  const int64_t max_pages = (options_.max_context_len + options_.page_size - 1) / options_.page_size;
  // The largest split workspace and item list any captured batch size can need.
  int64_t max_items = 0;
  int64_t max_part = 0;
  for (int bs = 1; bs <= max_bs; ++bs) {
    const int64_t blocks = static_cast<int64_t>(bs) * ((per_req * H + ck::kMlaBlockRows - 1) / ck::kMlaBlockRows);
    const int splits = choose_mla_splits(blocks, options_.max_context_len, num_sms_, 0);
    max_items = std::max(max_items, blocks * splits);
    if (splits > 1) max_part = std::max(max_part, static_cast<int64_t>(splits) * bs * per_req * H);
  }
  g.page_table.reserve(max_bs * max_pages, dev);
  for (DeviceArray<int32_t>* v : {&g.kv_lens, &g.q_lens, &g.first_token}) v->reserve(max_bs, dev);
  g.tree_bits.reserve(max_num_tokens, dev);
  g.items.reserve(4 * max_items, dev);
  g.num_items.reserve(1, dev);
  g.loc.reserve(max_num_tokens, dev);
  g.token_req.reserve(max_num_tokens, dev);
  g.token_pos.reserve(max_num_tokens, dev);
  g.part_o.reserve(max_part * ck::kMlaLoraRank, dev);
  g.part_lse.reserve(max_part, dev);
  g.slots.reserve(static_cast<int64_t>(max_num_tokens) * kMaxGraphTopk, dev);
  g.scores.reserve(static_cast<int64_t>(ck::indexer_workspace_bytes(max_num_tokens, options_.max_context_len) / sizeof(float)),
                   dev);
  for (DeviceArray<int32_t>* v : {&g.page_table, &g.kv_lens, &g.q_lens, &g.first_token, &g.items, &g.num_items, &g.loc,
                                  &g.token_req, &g.slots, &g.token_pos}) {
    v->freeze();
  }
  g.tree_bits.freeze();
  for (DeviceArray<float>* v : {&g.part_o, &g.part_lse, &g.scores}) v->freeze();
  g.fixed = true;
  st.graph_ready = true;
  st.graph_max_bs = max_bs;
  st.graph_max_tokens = max_num_tokens;
}

void CudaMlaBackend::init_forward_metadata_capture_cuda_graph(const ForwardBatch& batch) {
  SPECULA_CHECK(state_->graph_ready, "init_cuda_graph_state was not called before capture");
  build_metadata(batch, true);
  state_->graph_tree = state_->tree ? 1 : 0;
}

void CudaMlaBackend::init_forward_metadata_replay_cuda_graph(const ForwardBatch& batch) {
  SPECULA_CHECK(state_->graph_ready, "init_cuda_graph_state was not called before replay");
  build_metadata(batch, true);
  // The tree-bit pointer is baked into the graph's launches: a tree step cannot replay a chain graph.
  SPECULA_CHECK(state_->graph_tree == (state_->tree ? 1 : 0), "a {} verify step cannot replay graphs captured {}",
                state_->tree ? "tree-masked" : "causal", state_->graph_tree == 1 ? "with tree masks" : "causal");
}

void CudaMlaBackend::build_metadata(const ForwardBatch& batch, bool graph) {
  batch.validate();
  State& st = *state_;
  st.batch = &batch;
  st.mode = batch.forward_mode;
  st.num_tokens = batch.num_tokens();
  st.batch_size = batch.batch_size;
  st.active = graph ? &st.graph : &st.eager;
  st.expanded = false;
  if (batch.forward_mode == ForwardMode::IDLE || batch.batch_size == 0) return;
  SPECULA_CHECK(batch.req_to_token_pool != nullptr && batch.mla_kv_pool != nullptr,
                "the batch has no req_to_token_pool or MLA KV pool");
  SPECULA_CHECK(num_q_heads_ > 0, "check_layer must see the model's layers before init_forward_metadata");
  SPECULA_CHECK(!graph || batch.forward_mode == ForwardMode::DECODE || batch.forward_mode == ForwardMode::TARGET_VERIFY,
                "CUDA graphs serve DECODE and TARGET_VERIFY steps, not {}", forward_mode_name(batch.forward_mode));
  SPECULA_CHECK(!graph || (batch.batch_size <= st.graph_max_bs && st.num_tokens <= st.graph_max_tokens),
                "graph batch of {} requests / {} tokens exceeds init_cuda_graph_state's {} / {}", batch.batch_size,
                st.num_tokens, st.graph_max_bs, st.graph_max_tokens);
  const int bs = batch.batch_size;
  const int H = num_q_heads_;
  const int ps = options_.page_size;
  std::vector<int32_t> kv_lens(static_cast<size_t>(bs)), q_lens(static_cast<size_t>(bs)), first(static_cast<size_t>(bs));
  st.token_req.clear();
  st.token_pos.clear();
  int32_t token = 0;
  st.max_kv = 0;
  for (int i = 0; i < bs; ++i) {
    const auto ui = static_cast<size_t>(i);
    kv_lens[ui] = batch.kv_len(i);
    q_lens[ui] = batch.query_len(i);
    first[ui] = token;
    for (int32_t j = 0; j < q_lens[ui]; ++j) {
      st.token_req.push_back(i);
      st.token_pos.push_back(kv_lens[ui] - q_lens[ui] + j);
    }
    token += q_lens[ui];
    st.max_kv = std::max(st.max_kv, kv_lens[ui]);
  }
  SPECULA_CHECK(token == st.num_tokens, "the batch's query lengths add up to {} tokens but it has {}", token, st.num_tokens);
  const PageTable table = build_page_table(*batch.req_to_token_pool, batch.req_pool_indices, kv_lens, ps);
  const int64_t num_slots = batch.mla_kv_pool->num_slots();
  for (int i = 0; i < bs; ++i) {
    const int32_t pages = (kv_lens[static_cast<size_t>(i)] + ps - 1) / ps;
    for (int32_t pg = 0; pg < pages; ++pg) {
      const int64_t page = table.row(i)[pg];
      SPECULA_CHECK(page >= 0 && (page + 1) * ps <= num_slots,
                    "request {}: page {} of its KV (page id {}) is outside the MLA KV pool of {} slots", i, pg, page,
                    num_slots);
    }
  }
  // A graph keeps its page-table width: the widest any request can need.
  st.max_pages = graph ? (options_.max_context_len + ps - 1) / ps : table.max_pages;
  std::vector<int32_t> pages(static_cast<size_t>(bs) * static_cast<size_t>(st.max_pages), 0);
  for (int i = 0; i < bs; ++i) {
    std::copy(table.row(i), table.row(i) + table.max_pages,
              pages.begin() + static_cast<int64_t>(i) * st.max_pages);
  }

  // Tree masks become one bit per draft token: EAGLE trees show every query the whole prefix.
  const bool custom = batch.forward_mode == ForwardMode::TARGET_VERIFY && !batch.spec_info->custom_mask.empty();
  st.tree = custom;
  std::vector<uint64_t> bits;
  if (custom) {
    const int nd = batch.spec_info->num_draft_tokens;
    SPECULA_CHECK(batch.spec_info->prefix_visible,
                  "cuda MLA backend: TARGET_VERIFY masks must show every query its whole prefix "
                  "(SpecInfo::prefix_visible), as EAGLE trees do");
    SPECULA_CHECK(nd <= 64, "cuda MLA backend: tree masks of {} draft tokens are not supported; at most 64", nd);
    int64_t offset = 0;
    for (int i = 0; i < bs; ++i) {
      const int32_t kv_len = kv_lens[static_cast<size_t>(i)];
      for (int a = 0; a < nd; ++a) {
        const uint8_t* row = batch.spec_info->custom_mask.data() + offset + static_cast<int64_t>(a) * kv_len;
        uint64_t b = 0;
        for (int c = 0; c < nd; ++c) b |= static_cast<uint64_t>(row[kv_len - nd + c] != 0) << c;
        bits.push_back(b);
      }
      offset += static_cast<int64_t>(nd) * kv_len;
    }
  }

  // Dense work items: every request's row blocks times the splits.
  int64_t blocks = 0;
  for (int i = 0; i < bs; ++i) blocks += (q_lens[static_cast<size_t>(i)] * H + ck::kMlaBlockRows - 1) / ck::kMlaBlockRows;
  const bool chunked = is_extend_like(batch.forward_mode) && batch.forward_mode != ForwardMode::TARGET_VERIFY;
  const int plan_keys = graph ? options_.max_context_len : st.max_kv;
  st.dense_splits = choose_mla_splits(graph ? static_cast<int64_t>(bs) * ((q_lens[0] * H + 63) / 64) : blocks, plan_keys,
                                      num_sms_, chunked ? options_.prefix_chunk_tokens : 0);
  // The expanded form: chosen per step; its passes read every request's keys through the page table.
  st.expanded = !graph && chunked && batch.forward_mode != ForwardMode::DRAFT_EXTEND && expanded_problem_.empty() &&
                options_.extend_form != MlaExtendForm::absorbed &&
                (options_.extend_form == MlaExtendForm::expanded ||
                 prefer_expanded(kv_lens, q_lens, widths_.qk_nope_head_dim, widths_.v_head_dim));
  if (st.expanded) {
    std::vector<int32_t> slots;
    for (int i = 0; i < bs; ++i) {
      for (int32_t j = 0; j < kv_lens[static_cast<size_t>(i)]; ++j) slots.push_back(table.row(i)[j / ps] * ps + j % ps);
    }
    const int64_t rows = options_.expanded_chunk_rows > 0 ? options_.expanded_chunk_rows : default_expanded_chunk_rows(H);
    st.expanded_pass->plan(kv_lens, q_lens, slots, rows);
  }

  // A token's two head blocks of one split as adjacent items (ck::mla_head_blocks_pair).
  const int pair = ck::mla_head_blocks_pair(H) ? 2 : 1;
  std::vector<int32_t> items;
  for (int i = 0; i < bs; ++i) {
    const int nb = (q_lens[static_cast<size_t>(i)] * H + ck::kMlaBlockRows - 1) / ck::kMlaBlockRows;
    for (int b = 0; b < nb; b += pair) {
      for (int s = 0; s < st.dense_splits; ++s) {
        for (int r = 0; r < pair; ++r) items.insert(items.end(), {i, b + r, s, 0});
      }
    }
  }
  st.dense_items = static_cast<int>(items.size() / 4);

  DeviceSet& d = *st.active;
  const Device dev = options_.device;
  const cudaStream_t stream = st.stream;
  UploadBatch& up = st.uploads;
  d.page_table.upload(pages, dev, up);
  d.kv_lens.upload(kv_lens, dev, up);
  d.q_lens.upload(q_lens, dev, up);
  d.first_token.upload(first, dev, up);
  if (custom) d.tree_bits.upload(bits, dev, up);
  d.items.upload(items, dev, up);
  d.num_items.upload(std::vector<int32_t>{st.dense_items}, dev, up);
  d.loc.upload(batch.out_cache_loc, dev, up);
  d.token_req.upload(st.token_req, dev, up);
  d.token_pos.upload(st.token_pos, dev, up);
  up.flush(stream);
  if (st.dense_splits > 1) {
    const int64_t part = static_cast<int64_t>(st.dense_splits) * st.num_tokens * H;
    d.part_o.reserve(part * ck::kMlaLoraRank, dev);
    d.part_lse.reserve(part, dev);
  }
}

void CudaMlaBackend::check_tensors(const TensorView& q, const TensorView& out, const MlaLayer& layer, int q_width,
                                   int out_width, const MlaForwardOptions& options) const {
  const int64_t n = state_->num_tokens;
  const int H = layer.num_q_heads;
  check_shape(q, {n, H, q_width}, "MLA q");
  check_shape(out, {n, H, out_width}, "MLA output");
  check_dtype(out, DType::bf16, "MLA output");
  for (const TensorView* t : {&q, &out}) {
    check_device(*t, options_.device, "MLA q / output");
    SPECULA_CHECK(t->is_contiguous(), "MLA tensor {} must be contiguous", t->str());
  }
  if (options.lse.defined()) {
    check_shape(options.lse, {n, H}, "MLA lse");
    check_dtype(options.lse, DType::f32, "MLA lse");
    check_device(options.lse, options_.device, "MLA lse");
    SPECULA_CHECK(options.lse.is_contiguous(), "MLA lse {} must be contiguous", options.lse.str());
  }
}

const float* CudaMlaBackend::device_sinks(const MlaLayer& layer) const {
  if (layer.sinks.empty()) return nullptr;
  const auto it = state_->sinks.find(layer.layer_id);
  SPECULA_CHECK(it != state_->sinks.end() && it->second.first == layer.sinks,
                "layer {}'s sinks changed since check_layer uploaded them", layer.layer_id);
  return it->second.second.data_as<const float>();
}

bool CudaMlaBackend::expanded_step() const { return state_->expanded; }

void CudaMlaBackend::forward_expanded(const TensorView& q, const TensorView& kv_c, const TensorView& k_pe,
                                      const TensorView& out, const MlaLayer& layer, const ForwardBatch& batch,
                                      const MlaExpandFn& expand, const MlaForwardOptions& options) {
  State& st = *state_;
  SPECULA_CHECK(st.batch == &batch && st.mode == batch.forward_mode && st.num_tokens == batch.num_tokens(),
                "init_forward_metadata was not called for this batch before forward_expanded");
  SPECULA_CHECK(st.expanded, "cuda MLA backend: this {} step was planned in the absorbed form; call forward",
                forward_mode_name(batch.forward_mode));
  SPECULA_CHECK(!options.topk_indices.defined(), "cuda MLA backend: sparse top-k steps run in the absorbed form");
  MLAKVPool& pool = *batch.mla_kv_pool;
  check_layer(layer, q.dtype(), pool.format());
  SPECULA_CHECK(expanded_problem_.empty(), "cuda MLA backend: layer {}: {}", layer.layer_id, expanded_problem_);
  check_tensors(q, out, layer, layer.qk_nope_head_dim + layer.qk_rope_head_dim, layer.v_head_dim, options);
  if (options.save_kv_cache) {
    pool.set_mla_kv_buffer(layer.layer_id, st.active->loc.view(st.num_tokens), kv_c, k_pe, st.stream);
  }
  st.expanded_pass->run(q, out, options.lse, pool.kv_buffer(layer.layer_id).data_as<const uint8_t>(),
                        pool.format() == MlaKVFormat::fp8_ds_mla, pool.row_bytes(), layer, device_sinks(layer), expand);
}

void CudaMlaBackend::forward(const TensorView& q, const TensorView& kv_c, const TensorView& k_pe, const TensorView& out,
                             const MlaLayer& layer, const ForwardBatch& batch, const MlaForwardOptions& options) {
  State& st = *state_;
  SPECULA_CHECK(st.batch == &batch && st.mode == batch.forward_mode && st.num_tokens == batch.num_tokens(),
                "init_forward_metadata was not called for this batch before forward");
  if (batch.forward_mode == ForwardMode::IDLE || batch.batch_size == 0) return;
  MLAKVPool& pool = *batch.mla_kv_pool;
  check_layer(layer, q.dtype(), pool.format());
  SPECULA_CHECK(pool.kv_lora_rank() == layer.kv_lora_rank && pool.qk_rope_head_dim() == layer.qk_rope_head_dim,
                "layer {} has kv_lora_rank {} / rope {}, but the MLA pool holds {} / {}", layer.layer_id,
                layer.kv_lora_rank, layer.qk_rope_head_dim, pool.kv_lora_rank(), pool.qk_rope_head_dim());
  const int64_t n = st.num_tokens;
  const int H = layer.num_q_heads;
  check_tensors(q, out, layer, layer.qk_head_dim(), layer.kv_lora_rank, options);
  DeviceSet& d = *st.active;
  const cudaStream_t stream = st.stream;
  if (options.save_kv_cache) {
    pool.set_mla_kv_buffer(layer.layer_id, d.loc.view(n), kv_c, k_pe, stream);
  }
  if (n == 0) return;

  ck::MlaAttentionParams p{};
  p.q = q.data();
  p.out = out.data();
  p.lse = options.lse.defined() ? options.lse.data_as<float>() : nullptr;
  p.cache = pool.kv_buffer(layer.layer_id).data_as<const uint8_t>();
  p.fp8 = pool.format() == MlaKVFormat::fp8_ds_mla ? 1 : 0;
  p.row_bytes = pool.row_bytes();
  p.num_slots = pool.num_slots();
  p.page_table = d.page_table.data();
  p.max_pages = st.max_pages;
  p.page_size = options_.page_size;
  p.kv_lens = d.kv_lens.data();
  p.q_lens = d.q_lens.data();
  p.first_token = d.first_token.data();
  p.tree_bits = st.tree ? d.tree_bits.data() : nullptr;
  p.num_q_heads = H;
  p.scale_log2 = layer.scaling * 1.4426950408889634f;
  p.num_tokens = static_cast<int32_t>(n);
  p.split_align = ck::kMlaBlockKeys;
  p.sinks = device_sinks(layer);

  if (options.topk_indices.defined()) {
    const TensorView& idx = options.topk_indices;
    SPECULA_CHECK(idx.rank() == 2 && idx.size(0) == n, "topk_indices {} must be [{} tokens, topk]", idx.str(), n);
    check_dtype(idx, DType::i32, "topk_indices");
    check_device(idx, options_.device, "topk_indices");
    SPECULA_CHECK(idx.is_contiguous(), "topk_indices {} must be contiguous", idx.str());
    const int topk = static_cast<int>(idx.size(1));
    SPECULA_CHECK(topk >= 1, "topk_indices has no columns");
    d.slots.reserve(n * topk, options_.device);
    ck::SparseIndexParams c{};
    c.req_id_per_token = d.token_req.data();
    c.page_table = d.page_table.data();
    c.kv_lens = d.kv_lens.data();
    c.token_indices = idx.data_as<const int32_t>();
    c.out = d.slots.data();
    c.num_tokens = static_cast<int32_t>(n);
    c.topk = topk;
    c.batch_size = st.batch_size;
    c.max_pages = st.max_pages;
    c.page_size = options_.page_size;
    ck::launch_convert_req_index_to_global_index(c, stream);
    // Sparse work: every token's head blocks, split over its index list when the grid is small
    // (not under CUDA graphs, whose workspace was sized for dense splits).
    const int head_blocks = (H + ck::kMlaBlockRows - 1) / ck::kMlaBlockRows;
    const int splits = d.fixed ? 1 : choose_mla_splits(n * head_blocks, topk, num_sms_, 0);
    if (splits > 1) {
      d.part_o.reserve(splits * n * H * ck::kMlaLoraRank, options_.device);
      d.part_lse.reserve(splits * n * H, options_.device);
    }
    p.slots = d.slots.data();
    p.topk = topk;
    p.max_items = static_cast<int32_t>(n * head_blocks * splits);
    p.num_splits = splits;
    p.part_o = d.part_o.data();
    p.part_lse = d.part_lse.data();
  } else {
    p.items = reinterpret_cast<const ck::MlaWorkItem*>(d.items.data());
    p.num_items = d.num_items.data();
    p.max_items = st.dense_items;
    p.num_splits = st.dense_splits;
    p.part_o = d.part_o.data();
    p.part_lse = d.part_lse.data();
  }
  ck::launch_mla_attention(p, stream);
  ck::launch_mla_combine(p, stream);
}

void CudaMlaBackend::indexer_topk(const TensorView& q, const TensorView& weights, const TensorView& index_k,
                                  const MlaLayer& layer, const ForwardBatch& batch, const TensorView& out,
                                  bool save_index_k) {
  State& st = *state_;
  SPECULA_CHECK(st.batch == &batch && st.mode == batch.forward_mode && st.num_tokens == batch.num_tokens(),
                "init_forward_metadata was not called for this batch before indexer_topk");
  if (batch.forward_mode == ForwardMode::IDLE || batch.batch_size == 0) return;
  MLAKVPool& pool = *batch.mla_kv_pool;
  const int64_t n = st.num_tokens;
  const int index_dim = pool.config().index_head_dim;
  SPECULA_CHECK(index_dim > 0, "indexer_topk: the MLA pool keeps no indexer keys (index_head_dim 0)");
  SPECULA_CHECK(q.rank() == 3 && q.size(0) == n && q.size(2) == index_dim, "indexer q {} must be [{}, n_heads, {}]",
                q.str(), n, index_dim);
  check_dtype(q, DType::bf16, "indexer q");
  const int n_heads = static_cast<int>(q.size(1));
  check_shape(weights, {n, n_heads}, "indexer weights");
  check_dtype(weights, DType::f32, "indexer weights");
  SPECULA_CHECK(out.rank() == 2 && out.size(0) == n, "indexer output {} must be [{}, topk]", out.str(), n);
  check_dtype(out, DType::i32, "indexer output");
  for (const TensorView* t : {&q, &weights, &out}) {
    check_device(*t, options_.device, "indexer tensor");
    SPECULA_CHECK(t->is_contiguous(), "indexer tensor {} must be contiguous", t->str());
  }
  DeviceSet& d = *st.active;
  if (save_index_k) pool.set_index_k(layer.layer_id, d.loc.view(n), index_k, st.stream);
  if (n == 0) return;
  const int max_kv = d.fixed ? options_.max_context_len : st.max_kv;
  ck::IndexerParams p{};
  p.q = q.data();
  p.weights = weights.data_as<const float>();
  p.index_cache = pool.index_buffer(layer.layer_id).data_as<const uint8_t>();
  p.page_table = d.page_table.data();
  p.token_req = d.token_req.data();
  p.token_pos = d.token_pos.data();
  p.out = out.data_as<int32_t>();
  p.num_tokens = static_cast<int32_t>(n);
  p.n_heads = n_heads;
  p.index_head_dim = index_dim;
  p.max_pages = st.max_pages;
  p.page_size = options_.page_size;
  p.max_kv_len = max_kv;
  p.topk = static_cast<int32_t>(out.size(1));
  const ck::IndexerConfig config = ck::select_indexer(p);
  SPECULA_CHECK(config.unsupported.empty(), "cuda MLA backend: indexer {}", config.unsupported);
  const auto floats = static_cast<int64_t>((config.workspace_bytes + sizeof(float) - 1) / sizeof(float));
  d.scores.reserve(floats, options_.device);
  p.scores = d.scores.data();
  ck::launch_indexer_topk(p, st.stream);
}

}  // namespace specula
