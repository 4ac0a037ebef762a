// EagleCudaHead: the staging, the eager extend, the root store and the draft loop (eager or as
// captured graphs) on the target's stream.
#include "specula/speculative/eagle_cuda_head.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <functional>

#include "specula/core/cuda_check.h"
#include "specula/core/cuda_graph.h"
#include "specula/core/error.h"
#include "specula/core/pinned_buffer.h"
#include "specula/model/cuda/model_ops.h"
#include "specula/speculative/cuda/draft_kernels.h"

namespace specula {

namespace ck = cuda_kernels;

namespace {

template <typename T>
void upload_async(void* dst, const std::vector<T>& src, cudaStream_t s) {
  if (src.empty()) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, src.data(), src.size() * sizeof(T), cudaMemcpyHostToDevice, s));
}

}  // namespace

// Where each staged input of a loop of `batch` requests sits (all ints; the roots are in the store).
struct EagleCudaHead::LoopLayout {
  int64_t root_rows = 0, step_slots = 0, positions = 0, prefix_lens = 0, pages = 0, ints = 0;
};

EagleCudaHead::LoopLayout EagleCudaHead::layout(int batch, int S) const {
  const int64_t rows = static_cast<int64_t>(batch) * params_.topk;
  const int64_t steps = S - 1;
  LoopLayout l;
  l.root_rows = 0;
  l.step_slots = l.root_rows + batch;
  l.positions = l.step_slots + steps * rows;
  l.prefix_lens = l.positions + steps * rows;
  l.pages = l.prefix_lens + batch;
  l.ints = l.pages + static_cast<int64_t>(batch) * page_stride_;
  return l;
}

// The extend graphs' staged inputs for `batch` requests of N = num_draft_tokens rows each.
struct EagleCudaHead::ExtendLayout {
  int64_t ids = 0, positions = 0, slots = 0, prefix_lens = 0, pages = 0, branch = 0, branch_lens = 0, last_rows = 0,
          req_rows = 0, ints = 0, floats = 0;
};

EagleCudaHead::ExtendLayout EagleCudaHead::extend_layout(int batch, int N) const {
  const int64_t rows = static_cast<int64_t>(batch) * N;
  ExtendLayout l;
  l.positions = l.ids + rows;
  l.slots = l.positions + rows;
  l.prefix_lens = l.slots + rows;
  l.pages = l.prefix_lens + batch;
  l.branch = l.pages + static_cast<int64_t>(batch) * page_stride_;
  l.branch_lens = l.branch + rows * N;
  l.last_rows = l.branch_lens + rows;
  l.req_rows = l.last_rows + batch;
  l.ints = l.req_rows + batch;
  l.floats = rows * head_.feature_size();
  return l;
}

EagleCudaHead::EagleCudaHead(const EagleHead& head, const SpecParams& params, MHAKVPool& draft_kv,
                             AttentionBackend& backend, void* stream, const EagleCudaHeadOptions& options)
    : head_(head), params_(params), draft_kv_(draft_kv), backend_(backend), stream_(stream), options_(options) {
  const Device device = draft_kv.config().device;
  SPECULA_CHECK(device.is_cuda() && draft_kv.dtype() == DType::bf16,
                "the GPU draft head needs a bf16 KV pool on a GPU, not a {} pool on {}", dtype_name(draft_kv.dtype()),
                device.str());
  SPECULA_CHECK(params.topk <= ck::kMaxDraftTopK, "speculative topk {} is not supported on the GPU; the limit is {}",
                params.topk, ck::kMaxDraftTopK);
  SPECULA_CHECK(options.page_size >= 1 && options.max_context_len >= 1 && options.max_batch >= 1 &&
                    options.num_req_rows >= 1,
                "EagleCudaHead options: page_size {}, max_context_len {}, max_batch {}, num_req_rows {} must be >= 1",
                options.page_size, options.max_context_len, options.max_batch, options.num_req_rows);
  page_stride_ = (options.max_context_len + options.page_size - 1) / options.page_size;
  model_ = std::make_unique<EagleCudaModel>(head, device, stream);

  const int64_t rows = static_cast<int64_t>(options.max_batch) * params.topk;
  const int64_t h = head.hidden_size();
  const LoopLayout l = layout(options.max_batch, params.num_steps);
  loop_ints_ = Buffer(DType::i32, {l.ints}, device);
  // Zeroed: padding requests start from the padding row, which then holds valid token ids.
  const int64_t store_rows = static_cast<int64_t>(options.num_req_rows) + 1;
  roots_hidden_ = Buffer(DType::f32, {store_rows * h}, device);
  roots_tokens_ = Buffer(DType::i32, {store_rows * params.topk}, device);
  roots_probs_ = Buffer(DType::f32, {store_rows * params.topk}, device);
  for (Buffer* b : {&roots_hidden_, &roots_tokens_, &roots_probs_}) b->zero();
  frontier_scores_ = Buffer(DType::f32, {rows}, device);
  frontier_nodes_ = Buffer(DType::i32, {rows}, device);
  row_tokens_ = Buffer(DType::i32, {rows}, device);
  row_hidden_ = Buffer(DType::f32, {rows * h}, device);
  branch_ = Buffer(DType::i32, {rows * params.num_steps}, device);
  const int64_t cands = static_cast<int64_t>(options.max_batch) * ck::draft_num_candidates(params.topk, params.num_steps);
  // Tokens, parents and scores (f32 bits) as three rows of one buffer: one download per loop.
  cand_pitch_ = cands;
  cands_ = Buffer(DType::i32, {3 * cands}, device);

  std::vector<int> sizes = options.graph_batch_sizes;
  std::erase_if(sizes, [&](int bs) { return bs > options.max_batch; });
  if (sizes.empty()) return;
  SPECULA_CHECK(options.padding_slot >= 0, "draft CUDA graphs need a padding KV slot");
  const ExtendLayout le = extend_layout(options.max_batch, params.num_draft_tokens);
  ext_ints_ = Buffer(DType::i32, {le.ints}, device);
  ext_floats_ = Buffer(DType::f32, {le.floats}, device);
  // The counts to capture, largest first: the first capture sizes the shared workspace.
  std::vector<int> steps, tokens;
  for (const SpecShape& sh : options.shapes) {
    SPECULA_CHECK(sh.num_steps <= params.num_steps && sh.num_draft_tokens <= params.num_draft_tokens,
                  "draft shape {} exceeds the head's ({}, {})", sh.str(), params.num_steps, params.num_draft_tokens);
    if (sh.num_steps >= 2) steps.push_back(sh.num_steps);
    if (sh.num_draft_tokens >= 2) tokens.push_back(sh.num_draft_tokens);
  }
  if (options.shapes.empty()) {
    steps.push_back(params.num_steps);
    tokens.push_back(params.num_draft_tokens);
  }
  for (std::vector<int>* v : {&steps, &tokens}) {
    std::sort(v->rbegin(), v->rend());
    v->erase(std::unique(v->begin(), v->end()), v->end());
  }
  // Captured with padding requests only (staging no request): valid slots and pages everywhere.
  for (int N : tokens) {
    extend_graphs_[N].capture(
        stream_, sizes, [&](int bs) { stage_extend({}, bs, N); },
        [&](int bs) { extend_launches(extend_graph_ws_, bs, N); }, [&] { extend_graph_ws_.freeze(); });
  }
  for (int S : steps) {
    if (S < 2) continue;
    loop_graphs_[S].capture(
        stream_, sizes, [&](int bs) { stage_loop({}, bs, S); }, [&](int bs) { loop_launches(loop_ws_, bs, S); },
        [&] { loop_ws_.freeze(); });
  }
}

std::pair<int, const CudaGraph*> EagleCudaHead::extend_graph(int N, int batch) const {
  const auto it = extend_graphs_.find(N);
  if (it == extend_graphs_.end()) return {0, nullptr};
  return it->second.find(batch);
}

EagleCudaHead::~EagleCudaHead() = default;

void EagleCudaHead::check_req_row(const char* what, int32_t req_pool_idx) const {
  SPECULA_CHECK(req_pool_idx >= 0 && req_pool_idx < options_.num_req_rows, "{}: request index {} is out of range [0, {})",
                what, req_pool_idx, options_.num_req_rows);
}


Buffer& EagleCudaHead::scratch(Workspace& ws, Slot slot, DType dtype, int64_t elements) {
  return ws.get(slot, dtype, elements, draft_kv_.config().device);
}

void EagleCudaHead::forward(Workspace& ws, int64_t n, const int32_t* ids, const int32_t* positions,
                            const float* hidden_in, bool from_target, const CudaAttend& attend, const int32_t* row_ids,
                            int64_t rows, const int32_t* kv_slots) {
  CudaKvWrite kv;
  if (kv_slots != nullptr) {
    kv = {draft_kv_.k_buffer(0).data(), draft_kv_.v_buffer(0).data(), kv_slots, static_cast<int>(draft_kv_.dtype()),
          draft_kv_.k_scale(0), draft_kv_.v_scale(0)};
  }
  model_->forward(ws, n, ids, positions, hidden_in, from_target, attend, row_ids, rows, kv);
}

void EagleCudaHead::top_k(const float* logits, int64_t rows, int32_t* tokens, float* probs) {
  ck::DraftTopKParams t{};
  t.logits = logits;
  t.rows = rows;
  t.vocab = head_.draft_vocab_size();
  t.k = params_.topk;
  t.d2t = model_->d2t().data() != nullptr ? model_->d2t().data_as<const int64_t>() : nullptr;
  t.tokens = tokens;
  t.probs = probs;
  ck::draft_top_k(t, static_cast<cudaStream_t>(stream_));
}

void EagleCudaHead::extend(const ForwardBatch& batch, const float* features,
                           const std::vector<int32_t>& last_rows, const std::vector<int32_t>& req_pool_indices) {
  const auto s = static_cast<cudaStream_t>(stream_);
  const int64_t n = batch.num_tokens();
  const auto rows = static_cast<int64_t>(last_rows.size());
  SPECULA_CHECK(req_pool_indices.size() == last_rows.size(), "draft extend: {} request indices for {} rows",
                req_pool_indices.size(), last_rows.size());
  for (int32_t r : req_pool_indices) {
    check_req_row("draft extend", r);
  }
  const int h = head_.hidden_size();
  const int K = params_.topk;
  Workspace& ws = extend_ws_;
  Buffer& ids = scratch(ws, kIds, DType::i32, n);
  Buffer& pos = scratch(ws, kPos, DType::i32, n);
  Buffer& feats = scratch(ws, kFeatures, DType::f32, n * head_.feature_size());
  Buffer& row_ids = scratch(ws, kRowIds, DType::i32, rows);
  upload_async(ids.data(), batch.input_ids, s);
  upload_async(pos.data(), batch.positions, s);
  CUDA_CHECK(cudaMemcpyAsync(feats.data(), features, static_cast<size_t>(n * head_.feature_size()) * sizeof(float),
                             cudaMemcpyHostToDevice, s));
  upload_async(row_ids.data(), last_rows, s);
  if (extend_rows_.data() == nullptr || extend_rows_.numel() < rows) {
    extend_rows_ = Buffer(DType::i32, {rows}, draft_kv_.config().device);
  }
  upload_async(extend_rows_.data(), req_pool_indices, s);
  const AttentionLayer& layer = head_.attention_layer();
  const CudaAttend attend = [&](const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out) {
    backend_.forward(q, k, v, out, layer, batch);
  };
  forward(ws, n, ids.data_as<const int32_t>(), pos.data_as<const int32_t>(), feats.data_as<const float>(), true, attend,
          row_ids.data_as<const int32_t>(), rows);
  int32_t* top_tokens = scratch(ws, kTopTokens, DType::i32, rows * K).data_as<int32_t>();
  float* top_probs = scratch(ws, kTopProbs, DType::f32, rows * K).data_as<float>();
  top_k(ws[kLogits].data_as<const float>(), rows, top_tokens, top_probs);
  // The rows' hidden states (forward's kSelected holds them normed for EAGLE-3).
  float* hidden = scratch(ws, kNormed, DType::f32, rows * h).data_as<float>();
  ck::gather_rows(ws[kX].data_as<const float>(), row_ids.data_as<const int32_t>(), hidden, rows, h, s);
  store_roots(ws, extend_rows_.data_as<const int32_t>(), static_cast<int>(rows));
}

void EagleCudaHead::store_roots(Workspace& ws, const int32_t* store_rows, int rows) {
  ck::DraftRootStore store{roots_hidden_.data_as<float>(), roots_tokens_.data_as<int32_t>(),
                           roots_probs_.data_as<float>(), head_.hidden_size(), params_.topk};
  ck::draft_store_roots(store, store_rows, rows, ws[kNormed].data_as<const float>(),
                        ws[kTopTokens].data_as<const int32_t>(), ws[kTopProbs].data_as<const float>(),
                        static_cast<cudaStream_t>(stream_));
}

void EagleCudaHead::read_root(int32_t req_pool_idx, std::vector<float>& hidden, std::vector<int32_t>& tokens,
                              std::vector<float>& probs) {
  check_req_row("root read", req_pool_idx);
  const auto s = static_cast<cudaStream_t>(stream_);
  const int h = head_.hidden_size(), K = params_.topk;
  hidden.resize(static_cast<size_t>(h));
  tokens.resize(static_cast<size_t>(K));
  probs.resize(static_cast<size_t>(K));
  CUDA_CHECK(cudaMemcpyAsync(hidden.data(), roots_hidden_.data_as<float>() + static_cast<int64_t>(req_pool_idx) * h,
                             static_cast<size_t>(h) * 4, cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaMemcpyAsync(tokens.data(), roots_tokens_.data_as<int32_t>() + static_cast<int64_t>(req_pool_idx) * K,
                             static_cast<size_t>(K) * 4, cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaMemcpyAsync(probs.data(), roots_probs_.data_as<float>() + static_cast<int64_t>(req_pool_idx) * K,
                             static_cast<size_t>(K) * 4, cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
}

void EagleCudaHead::extend_launches(Workspace& ws, int batch, int N) {
  const auto s = static_cast<cudaStream_t>(stream_);
  const int K = params_.topk, h = head_.hidden_size();
  const int64_t rows = static_cast<int64_t>(batch) * N;
  const ExtendLayout l = extend_layout(batch, N);
  const int32_t* ints = ext_ints_.data_as<const int32_t>();
  const CudaAttend attend = [&](const TensorView& q, const TensorView&, const TensorView&, const TensorView& out) {
    attend_tree(q, out, N, ints + l.pages, ints + l.prefix_lens, ints + l.branch, N, 0, ints + l.branch_lens);
  };
  forward(ws, rows, ints + l.ids, ints + l.positions, ext_floats_.data_as<const float>(), true, attend, ints + l.last_rows,
          batch, ints + l.slots);
  top_k(ws[kLogits].data_as<const float>(), batch, scratch(ws, kTopTokens, DType::i32, static_cast<int64_t>(batch) * K).data_as<int32_t>(), scratch(ws, kTopProbs, DType::f32, static_cast<int64_t>(batch) * K).data_as<float>());
  ck::gather_rows(ws[kX].data_as<const float>(), ints + l.last_rows,
                  scratch(ws, kNormed, DType::f32, static_cast<int64_t>(batch) * h).data_as<float>(), batch, h, s);
  store_roots(ws, ints + l.req_rows, batch);
}

bool EagleCudaHead::extend_after_cycle(std::span<const DraftExtendInput> requests) {
  const auto B = static_cast<int>(requests.size());
  if (B == 0) return false;
  int longest = 0;
  for (const DraftExtendInput& r : requests) {
    if (r.len < 1) return false;
    longest = std::max(longest, r.len);
  }
  // The graph of the fewest rows per request that holds the longest run.
  for (const auto& [N, graphs] : extend_graphs_) {
    if (N < longest) continue;
    const auto [bs, graph] = graphs.find(B);
    if (graph == nullptr) return false;
    stage_extend(requests, bs, N);
    graph->launch(stream_);
    return true;
  }
  return false;
}

void EagleCudaHead::stage_extend(std::span<const DraftExtendInput> requests, int bs, int N, bool features) {
  const auto s = static_cast<cudaStream_t>(stream_);
  const auto B = static_cast<int>(requests.size());
  const ExtendLayout l = extend_layout(bs, N);
  const auto F = static_cast<size_t>(head_.feature_size());
  host_ints_.assign(static_cast<size_t>(l.ints), options_.padding_slot);
  if (features) host_floats_.assign(static_cast<size_t>(l.floats), 0.0f);
  auto at = [&](int64_t offset) -> int32_t& { return host_ints_[static_cast<size_t>(offset)]; };
  for (int b = 0; b < bs; ++b) {
    const DraftExtendInput* r = b < B ? &requests[static_cast<size_t>(b)] : nullptr;
    const int start = r != nullptr ? r->start : 0;
    const int len = r != nullptr ? r->len : 1;
    at(l.prefix_lens + b) = r != nullptr ? start : 1;
    at(l.last_rows + b) = b * N + len - 1;
    if (r != nullptr) {
      check_req_row("draft extend", r->req_pool_idx);
    }
    at(l.req_rows + b) = r != nullptr ? r->req_pool_idx : -1;  // padding requests store no root
    const int pages = (start + options_.page_size - 1) / options_.page_size;
    SPECULA_CHECK(start + len <= options_.max_context_len, "a draft extend to {} tokens exceeds max_context_len {}",
                  start + len, options_.max_context_len);
    for (int p = 0; p < page_stride_; ++p) {
      const int32_t slot = r != nullptr && p < pages ? r->req_row[p * options_.page_size] : options_.padding_slot;
      at(l.pages + static_cast<int64_t>(b) * page_stride_ + p) = slot / options_.page_size;
    }
    for (int q = 0; q < N; ++q) {
      const int64_t row = static_cast<int64_t>(b) * N + q;
      const bool real = r != nullptr && q < len;
      at(l.ids + row) = real ? r->tokens[q] : 0;
      at(l.positions + row) = real ? start + q : 0;
      if (real) at(l.slots + row) = r->req_row[start + q];
      // Causal among the request's new pairs: row q sees new pairs 0..q.
      at(l.branch_lens + row) = real ? q + 1 : 1;
      for (int i = 0; real && i <= q; ++i) at(l.branch + row * N + i) = r->req_row[start + i];
      if (real && features) {
        std::copy_n(r->features + static_cast<size_t>(q) * F, F, host_floats_.begin() + static_cast<int64_t>(row * F));
      }
    }
  }
  upload_async(ext_ints_.data(), host_ints_, s);
  if (features) {
    upload_async(ext_floats_.data(), host_floats_, s);
  } else if (bs > B) {
    // Padding requests' rows: finite features, so their (unused) outputs stay finite too.
    const int64_t real_floats = static_cast<int64_t>(B) * N * static_cast<int64_t>(F);
    CUDA_CHECK(cudaMemsetAsync(ext_floats_.data_as<float>() + real_floats, 0,
                               static_cast<size_t>(l.floats - real_floats) * sizeof(float), s));
  }
}

bool EagleCudaHead::stage_chain_extend(std::span<const DraftLoopInput> requests, int N) {
  const auto B = static_cast<int>(requests.size());
  const auto [bs, graph] = extend_graph(N, B);
  chain_extend_requests_ = 0;
  if (params_.topk != 1 || B == 0 || graph == nullptr) return false;
  // Every row as if the whole chain were accepted; launch_chain_extend supplies the ids, the
  // last rows and the features.
  const std::vector<int32_t> placeholder(static_cast<size_t>(N), 0);
  std::vector<DraftExtendInput> inputs;
  for (const DraftLoopInput& r : requests) {
    inputs.push_back({r.kv_len, N, r.req_pool_idx, r.req_row, placeholder.data(), nullptr});
  }
  stage_extend(inputs, bs, N, /*features=*/false);
  chain_extend_requests_ = B;
  chain_extend_tokens_ = N;
  return true;
}

void EagleCudaHead::launch_chain_extend(const VerifyDeviceResults& results) {
  const auto s = static_cast<cudaStream_t>(stream_);
  const int B = chain_extend_requests_;
  const int N = chain_extend_tokens_;
  SPECULA_CHECK(B > 0 && results.num_tokens >= static_cast<int64_t>(B) * N,
                "chain extend: a verify of {} tokens does not hold the {} staged chains of {}", results.num_tokens, B, N);
  const auto [bs, graph] = extend_graph(N, B);
  SPECULA_ASSERT(graph != nullptr);
  const ExtendLayout l = extend_layout(bs, N);
  int32_t* ints = ext_ints_.data_as<int32_t>();
  ck::ChainExtendParams p{};
  p.batch = B;
  p.n = N;
  p.verify_ids = results.input_ids;
  p.greedy = results.greedy_ids;
  p.features = results.captured;
  p.feature_width = head_.feature_size();
  p.ext_ids = ints + l.ids;
  p.last_rows = ints + l.last_rows;
  p.ext_features = ext_floats_.data_as<float>();
  ck::chain_extend_inputs(p, s);
  graph->launch(stream_);
  chain_extend_requests_ = 0;
}

void EagleCudaHead::attend_tree(const TensorView& q, const TensorView& out, int rows_per_seq, const int32_t* pages,
                                const int32_t* prefix_lens, const int32_t* branch, int branch_stride, int branch_len,
                                const int32_t* branch_lens) {
  DraftTreeView tree;
  tree.rows_per_seq = rows_per_seq;
  tree.prefix_pages = pages;
  tree.page_stride = page_stride_;
  tree.prefix_lens = prefix_lens;
  tree.branch_slots = branch;
  tree.branch_stride = branch_stride;
  tree.branch_len = branch_len;
  tree.branch_lens = branch_lens;
  backend_.forward_draft_tree(q, out, head_.attention_layer(), draft_kv_, tree);
}

void EagleCudaHead::loop_launches(Workspace& ws, int batch, int S) {
  const auto s = static_cast<cudaStream_t>(stream_);
  const int K = params_.topk;
  const int64_t rows = static_cast<int64_t>(batch) * K;
  const LoopLayout l = layout(batch, S);
  int32_t* ints = loop_ints_.data_as<int32_t>();
  ck::DraftTreeState st{};
  st.batch = batch;
  st.k = K;
  st.num_steps = S;
  st.hidden = head_.hidden_size();
  st.frontier_scores = frontier_scores_.data_as<float>();
  st.frontier_nodes = frontier_nodes_.data_as<int32_t>();
  st.row_tokens = row_tokens_.data_as<int32_t>();
  st.row_hidden = row_hidden_.data_as<float>();
  st.branch = branch_.data_as<int32_t>();
  st.step_slots = ints + l.step_slots;
  st.cand_tokens = cands_.data_as<int32_t>();
  st.cand_parents = cands_.data_as<int32_t>() + cand_pitch_;
  st.cand_scores = reinterpret_cast<float*>(cands_.data_as<int32_t>() + 2 * cand_pitch_);
  ck::draft_init(st, roots_tokens_.data_as<const int32_t>(), roots_probs_.data_as<const float>(),
                 roots_hidden_.data_as<const float>(), ints + l.root_rows, s);
  int32_t* top_tokens = scratch(ws, kTopTokens, DType::i32, rows * K).data_as<int32_t>();
  float* top_probs = scratch(ws, kTopProbs, DType::f32, rows * K).data_as<float>();
  for (int step = 1; step < S; ++step) {
    const int32_t* slots = ints + l.step_slots + (step - 1) * rows;
    const CudaAttend attend = [&](const TensorView& q, const TensorView&, const TensorView&, const TensorView& out) {
      attend_tree(q, out, K, ints + l.pages, ints + l.prefix_lens, st.branch, S, step, nullptr);
    };
    forward(ws, rows, st.row_tokens, ints + l.positions + (step - 1) * rows, st.row_hidden, false, attend, nullptr, rows,
            slots);
    if (K == 1) {
      ck::draft_top1_select(st, step, ws[kLogits].data_as<const float>(), head_.draft_vocab_size(),
                            model_->d2t().data() != nullptr ? model_->d2t().data_as<const int64_t>() : nullptr,
                            ws[kX].data_as<const float>(), s);
      continue;
    }
    top_k(ws[kLogits].data_as<const float>(), rows, top_tokens, top_probs);
    ck::draft_select(st, step, top_tokens, top_probs, ws[kX].data_as<const float>(), s);
  }
}

void EagleCudaHead::stage_loop(std::span<const DraftLoopInput> requests, int bs, int S) {
  const auto s = static_cast<cudaStream_t>(stream_);
  const auto B = static_cast<int>(requests.size());
  const int K = params_.topk;
  const LoopLayout l = layout(bs, S);
  const int64_t rows = static_cast<int64_t>(bs) * K;
  host_ints_.assign(static_cast<size_t>(l.ints), options_.padding_slot);
  for (int b = 0; b < bs; ++b) {
    const bool real = b < B;
    const DraftLoopInput* r = real ? &requests[static_cast<size_t>(b)] : nullptr;
    const int kv_len = real ? r->kv_len : 1;
    if (real) {
      check_req_row("draft loop", r->req_pool_idx);
    }
    host_ints_[static_cast<size_t>(l.root_rows + b)] = real ? r->req_pool_idx : padding_root_row();
    host_ints_[static_cast<size_t>(l.prefix_lens + b)] = kv_len;
    const int pages = (kv_len + options_.page_size - 1) / options_.page_size;
    SPECULA_CHECK(pages <= page_stride_, "a draft prefix of {} tokens exceeds max_context_len {}", kv_len,
                  options_.max_context_len);
    for (int p = 0; p < page_stride_; ++p) {
      const int32_t slot = real && p < pages ? r->req_row[p * options_.page_size] : options_.padding_slot;
      host_ints_[static_cast<size_t>(l.pages + static_cast<int64_t>(b) * page_stride_ + p)] = slot / options_.page_size;
    }
    for (int j = 0; j < K; ++j) {
      const int64_t row = static_cast<int64_t>(b) * K + j;
      for (int step = 1; step < S; ++step) {
        const int64_t at = (step - 1) * rows + row;
        if (real) host_ints_[static_cast<size_t>(l.step_slots + at)] = r->req_row[kv_len + (step - 1) * K + j];
        host_ints_[static_cast<size_t>(l.positions + at)] = real ? kv_len - 1 + step : step;
      }
    }
  }
  upload_async(loop_ints_.data(), host_ints_, s);
}

void EagleCudaHead::launch_draft_loop(std::span<const DraftLoopInput> requests, int S) {
  const auto s = static_cast<cudaStream_t>(stream_);
  const int K = params_.topk;
  const auto B = static_cast<int>(requests.size());
  loop_requests_ = 0;
  SPECULA_CHECK(S >= 1 && S <= params_.num_steps, "a draft loop of {} steps; the head was built for 1..{}", S,
                params_.num_steps);
  loop_steps_ = S;
  if (B == 0) return;
  SPECULA_CHECK(B <= options_.max_batch, "a draft loop of {} requests exceeds the head's max_batch {}", B,
                options_.max_batch);
  loop_requests_ = B;
  const int C = ck::draft_num_candidates(K, S);
  const auto count = static_cast<size_t>(B) * C;
  auto* host = static_cast<char*>(pinned_.reserve(3 * count * 4));
  if (S == 1) {
    // No steps: the tree's candidates are the root's top-k, read from the root store.
    const size_t bytes = static_cast<size_t>(K) * 4;
    for (int b = 0; b < B; ++b) {
      const int32_t row = requests[static_cast<size_t>(b)].req_pool_idx;
      check_req_row("draft loop", row);
      CUDA_CHECK(cudaMemcpyAsync(host + b * bytes, roots_tokens_.data_as<int32_t>() + row * K, bytes,
                                 cudaMemcpyDeviceToHost, s));
      CUDA_CHECK(cudaMemcpyAsync(host + 2 * count * 4 + b * bytes, roots_probs_.data_as<float>() + row * K, bytes,
                                 cudaMemcpyDeviceToHost, s));
    }
    return;
  }
  const auto graphs = loop_graphs_.find(S);
  const auto [graph_bs, graph] = graphs != loop_graphs_.end() ? graphs->second.find(B) : std::pair<int, const CudaGraph*>{0, nullptr};
  const int bs = graph != nullptr ? graph_bs : B;
  stage_loop(requests, bs, S);
  if (graph != nullptr) {
    graph->launch(stream_);
  } else {
    loop_launches(extend_ws_, bs, S);
  }
  // Queued behind the loop; the caller's next sync on the stream completes them.
  CUDA_CHECK(cudaMemcpy2DAsync(host, count * 4, cands_.data(), static_cast<size_t>(cand_pitch_) * 4, count * 4, 3,
                               cudaMemcpyDeviceToHost, s));
}

int EagleCudaHead::num_candidates() const { return ck::draft_num_candidates(params_.topk, loop_steps_); }

void EagleCudaHead::read_draft_candidates(std::vector<DraftCandidates>& candidates) const {
  const int K = params_.topk, S = loop_steps_;
  const int B = loop_requests_;
  const int C = ck::draft_num_candidates(K, S);
  const auto count = static_cast<size_t>(B) * C;
  const auto* host = static_cast<const char*>(pinned_.data());
  const auto* tokens = reinterpret_cast<const int32_t*>(host);
  const auto* parents = reinterpret_cast<const int32_t*>(host + count * 4);
  const auto* scores = reinterpret_cast<const float*>(host + 2 * count * 4);
  candidates.assign(static_cast<size_t>(B), {});
  for (int b = 0; b < B; ++b) {
    DraftCandidates& c = candidates[static_cast<size_t>(b)];
    const auto first = static_cast<int64_t>(b) * C;
    c.tokens.assign(tokens + first, tokens + first + C);
    c.scores.assign(scores + first, scores + first + C);
    c.depths.resize(static_cast<size_t>(C));
    for (int i = 0; i < C; ++i) c.depths[static_cast<size_t>(i)] = i < K ? 1 : 2 + (i - K) / (K * K);
    if (S == 1) {
      c.parents.assign(static_cast<size_t>(C), -1);
    } else {
      c.parents.assign(parents + first, parents + first + C);
    }
  }
}

void EagleCudaHead::draft_loop(std::span<const DraftLoopInput> requests, int num_steps,
                               std::vector<DraftCandidates>& candidates) {
  launch_draft_loop(requests, num_steps);
  CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)));
  read_draft_candidates(candidates);
}

}  // namespace specula
