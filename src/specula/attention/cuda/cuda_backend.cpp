// CudaAttentionBackend: host-side planning once per step (sequence descriptors, page table, prefill work items,
// local-attention virtual batches, decode split counts), uploads into device buffers that grow on
// demand (and are frozen in CUDA-graph mode so captured kernels keep valid pointers), the KV
// write, and the kernel launches.
#include "specula/attention/cuda/cuda_backend.h"
#include "specula/attention/cuda/cuda_backend_state.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <string>
#include <utility>
#include <vector>
#include <cuda_runtime_api.h>

#include "specula/attention/cuda/kernels/attention_params.h"
#include "specula/attention/cuda/kernels/prefill_wgmma.h"
#include "specula/attention/cuda/kernels/tree_attention.h"
#include "specula/core/dtype_code.h"
#include "specula/core/cuda_check.h"
#include "specula/core/device_array.h"
#include "specula/core/error.h"
#include "specula/core/upload_batch.h"
#include "specula/kv/mha_kv_pool.h"
#include "specula/kv/req_to_token_pool.h"

namespace specula {

namespace ck = cuda_kernels;

CudaAttentionBackend::CudaAttentionBackend(const AttentionBackendOptions& options)
    : options_(options), state_(new State) {
  SPECULA_CHECK(options.device.is_cuda(), "the cuda attention backend needs a CUDA device, not {}",
                options.device.str());
  SPECULA_CHECK(cuda_available(), "the cuda attention backend was requested, but no CUDA device is visible");
  SPECULA_CHECK(options.page_size >= 1 && (options.page_size & (options.page_size - 1)) == 0,
                "page_size {} is not valid; it must be a power of two >= 1", options.page_size);
  SPECULA_CHECK(options.attention_chunk_size == 0 || options.attention_chunk_size % options.page_size == 0,
                "attention_chunk_size {} is not valid; it must be a multiple of page_size {}",
                options.attention_chunk_size, options.page_size);
  state_->device = options.device;
  state_->stream = static_cast<cudaStream_t>(options.cuda_stream);
  state_->uploads = UploadBatch(options.device);
  CUDA_CHECK(cudaSetDevice(options.device.index));
  CUDA_CHECK(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, options.device.index));
  int l2 = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, options.device.index));
  l2_bytes_ = l2;
}

CudaAttentionBackend::~CudaAttentionBackend() { delete state_; }

CudaAttentionShape CudaAttentionBackend::base_shape() const {
  CudaAttentionShape shape;
  shape.page_size = options_.page_size;
  shape.attention_chunk_size = options_.attention_chunk_size;
  shape.num_sms = num_sms_;
  shape.l2_bytes = l2_bytes_;
  shape.deterministic = options_.deterministic;
  shape.max_context_len = options_.max_context_len;
  return shape;
}

CudaAttentionShape CudaAttentionBackend::decode_shape(int batch_size, int64_t num_tokens, int max_kv_len) const {
  CudaAttentionShape shape = base_shape();
  shape.batch_size = batch_size;
  shape.num_tokens = num_tokens;
  shape.max_kv_len = max_kv_len;
  return shape;
}

void CudaAttentionBackend::check_layer(const AttentionLayer& layer, DType q_dtype, DType kv_dtype) const {
  // Every layer must serve both extend-like and decode steps; verify and draft steps fall back
  // to the prefill kernels, or are refused when they run.
  const CudaAttentionShape shape = base_shape();
  const auto require = [&](const CudaAttentionPlan& plan) {
    SPECULA_CHECK(plan.supported(), "cuda attention backend cannot serve layer {}: {}", layer.layer_id,
                  plan.unsupported_reason);
  };
  require(select_cuda_extend(layer, q_dtype, kv_dtype, shape));
  if (layer.dca_chunk_len > 0) {
    SPECULA_CHECK(dca_chunk_len_ == 0 || (dca_chunk_len_ == layer.dca_chunk_len &&
                                          dca_original_max_ == layer.dca_original_max_position),
                  "layer {}: dual chunk attention with chunk length {} and original length {}, where an earlier "
                  "layer has {} and {}; the cuda backend serves one setting per model",
                  layer.layer_id, layer.dca_chunk_len, layer.dca_original_max_position, dca_chunk_len_,
                  dca_original_max_);
    dca_chunk_len_ = layer.dca_chunk_len;
    dca_original_max_ = layer.dca_original_max_position;
    if (layer.dca_sparse != nullptr) {
      // The step plan takes the pattern's threshold and estimating queries from the first layer.
      const DualChunkSparsePattern& s = *layer.dca_sparse;
      if (!dca_sparse_) dca_sparse_ = s;
      SPECULA_CHECK(s.threshold == dca_sparse_->threshold && s.last_q == dca_sparse_->last_q,
                    "layer {}: sparse_attention_threshold {} and last_q {}, where an earlier layer has {} and {}; the "
                    "cuda backend serves one setting per model",
                    layer.layer_id, s.threshold, s.last_q, dca_sparse_->threshold, dca_sparse_->last_q);
    }
  }
  require(select_cuda_decode(layer, q_dtype, kv_dtype, shape));
  const HeadLayout layout{layer.num_q_heads, layer.num_kv_heads, layer.head_dim, layer.use_local_attention};
  // Looked up first: forward checks every layer again, and copying it (sinks) each time would cost.
  if (layouts_.find(layout) == layouts_.end()) layouts_.emplace(layout, CheckedLayer{layer, q_dtype, kv_dtype});
  all_layers_tree_ok_ = all_layers_tree_ok_ && select_cuda_draft_tree(layer, q_dtype, kv_dtype, shape).supported();
}

std::map<CudaAttentionBackend::HeadLayout, DecodePlan> CudaAttentionBackend::plan_decode_step(
    const CudaAttentionShape& shape, DecodeWorkspace& workspace) const {
  std::map<HeadLayout, DecodePlan> plans;
  workspace = {};
  for (const auto& [layout, checked] : layouts_) {
    const CudaAttentionPlan plan = select_cuda_decode(checked.layer, checked.q_dtype, checked.kv_dtype, shape);
    SPECULA_ASSERT(plan.supported(), "a checked layer's decode is unsupported: {}", plan.unsupported_reason);
    plans[layout] = plan.decode;
    workspace.cover(plan.workspace);
  }
  return plans;
}

void CudaAttentionBackend::init_forward_metadata(const ForwardBatch& batch) { build_metadata(batch, false); }

void CudaAttentionBackend::build_metadata(const ForwardBatch& batch, bool graph) {
  state_->uploads.clear();
  stage_metadata(batch, graph);
  state_->uploads.flush(state_->stream);
}

void CudaAttentionBackend::stage_metadata(const ForwardBatch& batch, bool graph) {
  begin_step(batch, graph);
  if (batch.forward_mode == ForwardMode::IDLE || batch.batch_size == 0) return;
  const Sequences seqs = stage_sequences(batch, graph);
  if (batch.forward_mode == ForwardMode::DECODE) {
    stage_decode(batch.batch_size, graph);
    return;
  }
  stage_prefill_items(seqs.q_lens);
  stage_tree_mask(batch, seqs, graph);
  if (options_.attention_chunk_size > 0) stage_local_batches(seqs);
  if (dca_chunk_len_ > 0 && batch.forward_mode != ForwardMode::TARGET_VERIFY) stage_dual_chunk(seqs);
}

// Checks the step against graph mode and forgets the previous step's plan.
void CudaAttentionBackend::begin_step(const ForwardBatch& batch, bool graph) {
  State& st = *state_;
  batch.validate();
  SPECULA_CHECK(!graph || batch.forward_mode == ForwardMode::DECODE || batch.forward_mode == ForwardMode::TARGET_VERIFY,
                "CUDA graphs of the cuda attention backend cover DECODE and TARGET_VERIFY steps; got {}",
                forward_mode_name(batch.forward_mode));
  SPECULA_CHECK(!graph || options_.attention_chunk_size == 0,
                "CUDA graphs of TARGET_VERIFY steps do not support local chunked attention");
  st.active = graph ? &st.graph : &st.eager;
  st.mode = batch.forward_mode;
  st.batch = &batch;
  st.num_tokens = batch.num_tokens();
  st.num_seqs = batch.batch_size;
  st.num_items = 0;
  st.local_num_seqs = 0;
  st.local_num_items = 0;
  st.has_custom_mask = false;
  st.dca_staged = false;
  st.tree_path = false;
  st.decode_plans.clear();
}

// Lengths, page table (padded to the graph's stride in graph mode), cu_seqlens and KV write slots.
CudaAttentionBackend::Sequences CudaAttentionBackend::stage_sequences(const ForwardBatch& batch, bool graph) {
  State& st = *state_;
  State::StepArrays& arrays = *st.active;
  SPECULA_CHECK(batch.req_to_token_pool != nullptr && batch.token_to_kv_pool != nullptr,
                "the batch has no req_to_token_pool or KV pool");
  SPECULA_CHECK(batch.token_to_kv_pool->config().device == options_.device, "the KV pool is on {}, the backend on {}",
                batch.token_to_kv_pool->config().device.str(), options_.device.str());
  const int bs = batch.batch_size;
  const int page_size = options_.page_size;
  Sequences seqs;
  seqs.kv_lens.resize(static_cast<size_t>(bs));
  seqs.q_lens.resize(static_cast<size_t>(bs));
  for (int i = 0; i < bs; ++i) {
    seqs.kv_lens[static_cast<size_t>(i)] = batch.kv_len(i);
    seqs.q_lens[static_cast<size_t>(i)] = batch.query_len(i);
  }
  st.max_kv_len = *std::max_element(seqs.kv_lens.begin(), seqs.kv_lens.end());
  st.kv_rows = std::accumulate(seqs.kv_lens.begin(), seqs.kv_lens.end(), int64_t{0});
  seqs.table = build_page_table(*batch.req_to_token_pool, batch.req_pool_indices, seqs.kv_lens, page_size);
  const PageTable& table = seqs.table;
  const int64_t num_slots = batch.token_to_kv_pool->num_slots();
  for (int32_t page : table.pages) {
    SPECULA_CHECK(page >= 0 && (static_cast<int64_t>(page) + 1) * page_size <= num_slots,
                  "page id {} lies outside the KV pool of {} slots", page, num_slots);
  }
  std::vector<int32_t> pages;
  if (graph) {
    SPECULA_CHECK(bs <= st.graph_max_bs, "batch of {} exceeds the CUDA-graph max_bs {}", bs, st.graph_max_bs);
    SPECULA_CHECK(table.max_pages <= st.graph_pages_stride,
                  "a request of {} tokens exceeds max_context_len {} given for CUDA graphs", st.max_kv_len,
                  options_.max_context_len);
    st.page_table_stride = st.graph_pages_stride;
    pages.assign(static_cast<size_t>(bs) * st.page_table_stride, 0);
    for (int i = 0; i < bs; ++i) {
      std::copy(table.row(i), table.row(i) + table.max_pages, pages.begin() + static_cast<int64_t>(i) * st.page_table_stride);
    }
  } else {
    st.page_table_stride = table.max_pages;
    pages = table.pages;
  }
  seqs.cu_q = cumulative_lens(seqs.q_lens);
  arrays.cu_q.upload(seqs.cu_q, st.device, st.uploads);
  arrays.kv_lens.upload(seqs.kv_lens, st.device, st.uploads);
  arrays.pages.upload(pages, st.device, st.uploads);
  arrays.out_loc.upload(batch.out_cache_loc, st.device, st.uploads);
  return seqs;
}

// Every checked layout's split plan and the workspace they share. A graph plans for
// max_context_len, so one capture serves every length (init_cuda_graph_state sized the same way).
void CudaAttentionBackend::stage_decode(int batch_size, bool graph) {
  State& st = *state_;
  State::StepArrays& arrays = *st.active;
  DecodeWorkspace workspace;
  st.decode_plans = plan_decode_step(
      decode_shape(batch_size, st.num_tokens, graph ? options_.max_context_len : st.max_kv_len), workspace);
  if (workspace.partial_rows > 0) {
    arrays.partial_lse.reserve(workspace.partial_rows, st.device);
    arrays.partial_out.reserve(workspace.partial_values, st.device);
    arrays.split_counters.reserve_zeroed(workspace.counters, st.device, st.stream);
  }
}

// Extend-like modes: tiles of kPrefillTileRows query rows.
void CudaAttentionBackend::stage_prefill_items(const std::vector<int32_t>& q_lens) {
  State& st = *state_;
  std::vector<int32_t> items;
  for (int i = 0; i < static_cast<int>(q_lens.size()); ++i) {
    for (int q = 0; q < q_lens[static_cast<size_t>(i)]; q += ck::kPrefillTileRows) {
      items.push_back(i);
      items.push_back(q);
    }
  }
  st.num_items = static_cast<int>(items.size() / 2);
  st.active->items.upload(items, st.device, st.uploads);
}

// TARGET_VERIFY: the tree kernel's rows where the prefix is visible, and the full mask when some
// checked layer attends through the prefill kernels (or the prefix is not visible).
void CudaAttentionBackend::stage_tree_mask(const ForwardBatch& batch, const Sequences& seqs, bool graph) {
  State& st = *state_;
  // A captured verify step always reads a tree mask whose prefix is visible (its kernels were
  // recorded with one).
  SPECULA_CHECK(!graph || (!batch.spec_info->custom_mask.empty() && batch.spec_info->prefix_visible),
                "a CUDA-graph TARGET_VERIFY step needs its tree mask, with the prefix visible");
  if (batch.forward_mode != ForwardMode::TARGET_VERIFY || batch.spec_info->custom_mask.empty()) return;
  const int bs = batch.batch_size;
  std::vector<int64_t> offsets(static_cast<size_t>(bs));
  int64_t offset = 0;
  for (int i = 0; i < bs; ++i) {
    offsets[static_cast<size_t>(i)] = offset;
    offset += static_cast<int64_t>(seqs.q_lens[static_cast<size_t>(i)]) * seqs.kv_lens[static_cast<size_t>(i)];
  }
  if (batch.spec_info->prefix_visible) stage_tree_rows(batch, seqs, offsets);
  if (!st.tree_path || !all_layers_tree_ok_) {
    st.active->mask_offsets.upload(offsets, st.device, st.uploads);
    st.active->custom_mask.upload(batch.spec_info->custom_mask, st.device, st.uploads);
    st.has_custom_mask = true;
  }
}

// Per query row: the slots of the tree tokens its mask row shows (after the visible prefix).
void CudaAttentionBackend::stage_tree_rows(const ForwardBatch& batch, const Sequences& seqs,
                                           const std::vector<int64_t>& mask_offsets) {
  State& st = *state_;
  const std::vector<uint8_t>& mask = batch.spec_info->custom_mask;
  const int N = batch.spec_info->num_draft_tokens;
  std::vector<int32_t> slots(static_cast<size_t>(st.num_tokens) * N, 0), lens(static_cast<size_t>(st.num_tokens));
  for (int i = 0; i < batch.batch_size; ++i) {
    const int32_t prefix = batch.seq_lens[static_cast<size_t>(i)];
    const int32_t kv = seqs.kv_lens[static_cast<size_t>(i)];
    for (int q = 0; q < N; ++q) {
      const int64_t row = static_cast<int64_t>(i) * N + q;
      const uint8_t* m = mask.data() + mask_offsets[static_cast<size_t>(i)] + static_cast<int64_t>(q) * kv + prefix;
      int count = 0;
      for (int j = 0; j < N; ++j) {
        if (m[j] != 0) slots[static_cast<size_t>(row * N + count++)] = batch.out_cache_loc[static_cast<size_t>(i * N + j)];
      }
      lens[static_cast<size_t>(row)] = count;
    }
  }
  st.active->tree_slots.upload(slots, st.device, st.uploads);
  st.active->tree_lens.upload(lens, st.device, st.uploads);
  st.active->prefix_lens.upload(batch.seq_lens, st.device, st.uploads);
  st.tree_path = true;
  st.tree_rows_per_seq = N;
}

// Local chunked attention: the virtual batches of attention_chunk_size tokens and their tiles.
void CudaAttentionBackend::stage_local_batches(const Sequences& seqs) {
  State& st = *state_;
  const LocalAttentionBatches local = make_local_attention_virtual_batches(
      options_.attention_chunk_size, seqs.cu_q, seqs.kv_lens, seqs.table.pages, seqs.table.max_pages,
      options_.page_size);
  std::vector<int32_t> local_items;
  for (int v = 0; v < local.num_virtual(); ++v) {
    for (int q = 0; q < local.seqlens_q_local[static_cast<size_t>(v)]; q += ck::kPrefillTileRows) {
      local_items.push_back(v);
      local_items.push_back(q);
    }
  }
  st.local_num_seqs = local.num_virtual();
  st.local_stride = local.pages_per_local_batch;
  st.local_num_items = static_cast<int>(local_items.size() / 2);
  st.local_kv_rows = std::accumulate(local.seqlens_k_local.begin(), local.seqlens_k_local.end(), int64_t{0});
  st.local_cu_q.upload(local.cu_seqlens_q_local, st.device, st.uploads);
  st.local_kv_lens.upload(local.seqlens_k_local, st.device, st.uploads);
  st.local_pages.upload(local.block_table_local, st.device, st.uploads);
  st.local_items.upload(local_items, st.device, st.uploads);
}

void CudaAttentionBackend::forward_extend(const TensorView& q, const TensorView& k, const TensorView& v,
                                          const TensorView& out, const AttentionLayer& layer, const ForwardBatch& batch,
                                          const ForwardOptions& options) {
  SPECULA_CHECK(is_extend_like(batch.forward_mode), "forward_extend called for a {} batch",
                forward_mode_name(batch.forward_mode));
  run(q, k, v, out, layer, batch, options);
}

void CudaAttentionBackend::forward_decode(const TensorView& q, const TensorView& k, const TensorView& v,
                                          const TensorView& out, const AttentionLayer& layer, const ForwardBatch& batch,
                                          const ForwardOptions& options) {
  SPECULA_CHECK(batch.forward_mode == ForwardMode::DECODE, "forward_decode called for a {} batch",
                forward_mode_name(batch.forward_mode));
  run(q, k, v, out, layer, batch, options);
}

void CudaAttentionBackend::run(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                               const AttentionLayer& layer, const ForwardBatch& batch, const ForwardOptions& options) {
  State& st = *state_;
  SPECULA_CHECK(st.batch == &batch && st.mode == batch.forward_mode && st.num_tokens == batch.num_tokens(),
                "init_forward_metadata was not called for this batch before forward");
  if (batch.batch_size == 0 || st.num_tokens == 0) return;
  MHAKVPool& pool = *batch.token_to_kv_pool;
  check_forward_args(q, out, layer, pool, options);
  if (options.save_kv_cache) {
    const TensorView loc(st.active->out_loc.data(), DType::i32, {st.num_tokens}, options_.device);
    pool.set_kv_buffer(layer.layer_id, loc, k, v, st.stream);
  }
  if (batch.forward_mode == ForwardMode::DECODE) {
    run_decode(q, out, layer, pool, options);
    return;
  }
  CudaAttentionShape shape = base_shape();
  shape.kv_rows = layer.use_local_attention ? st.local_kv_rows : st.kv_rows;
  shape.custom_mask = st.has_custom_mask;
  shape.tree_staged = st.tree_path;
  shape.rows_contiguous = dense_rows(q, layer) && dense_rows(out, layer);
  const CudaAttentionPlan plan = batch.forward_mode == ForwardMode::TARGET_VERIFY
                                     ? select_cuda_verify(layer, q.dtype(), pool.dtype(), shape)
                                     : select_cuda_extend(layer, q.dtype(), pool.dtype(), shape);
  SPECULA_CHECK(plan.supported(), "layer {}: {}", layer.layer_id, plan.unsupported_reason);
  if (layer.dca_chunk_len > 0) {
    run_dual_chunk(q, out, layer, pool, options);
    return;
  }
  if (plan.kernel == CudaAttentionKernel::kTree) {
    DraftTreeView tree;
    tree.rows_per_seq = st.tree_rows_per_seq;
    tree.prefix_pages = st.active->pages.data();
    tree.page_stride = st.page_table_stride;
    tree.prefix_lens = st.active->prefix_lens.data();
    tree.branch_slots = st.active->tree_slots.data();
    tree.branch_stride = st.tree_rows_per_seq;
    tree.branch_lens = st.active->tree_lens.data();
    launch_tree(q, out, layer, pool, tree, options);
    return;
  }
  run_prefill(plan, q, out, layer, pool, options);
}

// The argument checks every forward shares (the layer again: it may not be one check_layer saw).
void CudaAttentionBackend::check_forward_args(const TensorView& q, const TensorView& out, const AttentionLayer& layer,
                                              const MHAKVPool& pool, const ForwardOptions& options) const {
  check_layer(layer, q.dtype(), pool.dtype());
  const int64_t n = state_->num_tokens;
  check_shape(q, {n, layer.num_q_heads, layer.dca_q_variants() * layer.head_dim}, "q");
  check_shape(out, {n, layer.num_q_heads, layer.head_dim}, "attention output");
  check_dtype(out, q.dtype(), "attention output");
  for (const TensorView* t : {&q, &out}) {
    check_device(*t, options_.device, "q / attention output");
    SPECULA_CHECK(t->stride(2) == 1 && t->stride(1) % 8 == 0 && t->stride(0) % 8 == 0,
                  "{} needs contiguous head_dim and strides that are multiples of 8", t->str());
  }
  SPECULA_CHECK(pool.config().num_kv_heads == layer.num_kv_heads && pool.config().head_dim == layer.head_dim,
                "layer {} has {} KV heads of dim {}, but the KV pool holds {} heads of dim {}", layer.layer_id,
                layer.num_kv_heads, layer.head_dim, pool.config().num_kv_heads, pool.config().head_dim);
  if (options.lse.defined()) {
    check_shape(options.lse, {n, layer.num_q_heads}, "lse");
    check_dtype(options.lse, DType::f32, "lse");
    check_device(options.lse, options_.device, "lse");
    SPECULA_CHECK(options.lse.stride(1) == 1, "lse {} needs contiguous heads", options.lse.str());
  }
}

void CudaAttentionBackend::launch_tree(const TensorView& q, const TensorView& out, const AttentionLayer& layer,
                                       const MHAKVPool& pool, const DraftTreeView& tree, const ForwardOptions& options) {
  ck::TreeAttentionParams t{};
  t.q = q.data();
  t.k_cache = pool.k_buffer(layer.layer_id).data();
  t.v_cache = pool.v_buffer(layer.layer_id).data();
  t.out = out.data();
  t.rows = static_cast<int>(q.size(0));
  t.rows_per_seq = tree.rows_per_seq;
  t.num_q_heads = layer.num_q_heads;
  t.num_kv_heads = layer.num_kv_heads;
  t.head_dim = layer.head_dim;
  t.scale = layer.effective_scaling();
  t.prefix_pages = tree.prefix_pages;
  t.page_stride = tree.page_stride;
  t.page_size = options_.page_size;
  t.prefix_lens = tree.prefix_lens;
  t.branch_slots = tree.branch_slots;
  t.branch_stride = tree.branch_stride;
  t.branch_len = tree.branch_len;
  t.branch_lens = tree.branch_lens;
  t.lse = options.lse.defined() ? options.lse.data_as<float>() : nullptr;
  t.lse_stride_token = options.lse.defined() ? options.lse.stride(0) : 0;
  t.kv_fp8 = pool.dtype() == DType::fp8_e4m3;
  t.k_descale = t.kv_fp8 ? pool.k_scale(layer.layer_id) : 1.0f;
  t.v_descale = t.kv_fp8 ? pool.v_scale(layer.layer_id) : 1.0f;
  ck::tree_attention(t, state_->stream);
}

// The Params fields every non-tree launch shares: q, out, the layer's cache and its facts.
ck::AttentionParams cuda_layer_params(const TensorView& q, const TensorView& out, const AttentionLayer& layer,
                                 const MHAKVPool& pool, const ForwardOptions& options, int page_size) {
  const bool fp8 = pool.dtype() == DType::fp8_e4m3;
  ck::AttentionParams p{};
  p.q = q.data();
  p.q_stride_token = q.stride(0);
  p.q_stride_head = q.stride(1);
  p.out = out.data();
  p.out_stride_token = out.stride(0);
  p.out_stride_head = out.stride(1);
  p.lse = options.lse.defined() ? options.lse.data_as<float>() : nullptr;
  p.lse_stride_token = options.lse.defined() ? options.lse.stride(0) : 0;
  p.io_dtype = kernel_dtype_code(q.dtype());
  p.k_cache = pool.k_buffer(layer.layer_id).data();
  p.v_cache = pool.v_buffer(layer.layer_id).data();
  p.kv_dtype = kernel_dtype_code(pool.dtype());
  p.k_descale = fp8 ? pool.k_scale(layer.layer_id) : 1.0f;
  p.v_descale = fp8 ? pool.v_scale(layer.layer_id) : 1.0f;
  p.num_q_heads = layer.num_q_heads;
  p.num_kv_heads = layer.num_kv_heads;
  p.head_dim = layer.head_dim;
  p.v_head_dim = layer.head_dim;
  p.page_size = page_size;
  p.scale = layer.effective_scaling();
  p.logit_cap = layer.logit_cap;
  p.window_left = layer.sliding_window_size;
  p.causal = layer.attn_type == AttentionType::DECODER ? 1 : 0;
  return p;
}

const float* CudaAttentionBackend::device_sinks(const AttentionLayer& layer) {
  if (layer.sinks.empty()) return nullptr;
  auto& [values, buffer] = state_->sinks[layer.layer_id];
  if (values != layer.sinks) {
    values = layer.sinks;
    buffer = Buffer(DType::f32, {layer.num_q_heads}, options_.device);
    copy(buffer, TensorView(values.data(), DType::f32, {layer.num_q_heads}));
  }
  return buffer.data_as<const float>();
}

// The plan init_forward_metadata selected for the layer's head layout (its workspace is sized).
void CudaAttentionBackend::run_decode(const TensorView& q, const TensorView& out, const AttentionLayer& layer,
                                      const MHAKVPool& pool, const ForwardOptions& options) {
  State& st = *state_;
  const bool local = layer.use_local_attention;
  // The decode kernel indexes cache rows (slot x KV heads + head) in 32 bits.
  SPECULA_CHECK(pool.num_slots() * layer.num_kv_heads <= std::numeric_limits<int32_t>::max(),
                "KV pool of {} slots x {} KV heads exceeds the decode kernel's {} cache rows", pool.num_slots(),
                layer.num_kv_heads, std::numeric_limits<int32_t>::max());
  const auto it = st.decode_plans.find(HeadLayout{layer.num_q_heads, layer.num_kv_heads, layer.head_dim, local});
  SPECULA_CHECK(it != st.decode_plans.end(),
                "layer {} ({} query / {} KV heads of dim {}) was not passed to check_layer before "
                "init_forward_metadata",
                layer.layer_id, layer.num_q_heads, layer.num_kv_heads, layer.head_dim);
  ck::AttentionParams p = cuda_layer_params(q, out, layer, pool, options, options_.page_size);
  p.chunk_size = local ? options_.attention_chunk_size : 0;
  p.dca_chunk_len = layer.dca_chunk_len;
  p.dca_original_max_position = layer.dca_original_max_position;
  p.sinks = device_sinks(layer);
  p.num_seqs = st.num_seqs;
  p.cu_seqlens_q = st.active->cu_q.data();
  p.seq_lens_k = st.active->kv_lens.data();
  p.page_table = st.active->pages.data();
  p.page_table_stride = st.page_table_stride;
  ck::DecodeSplit split{};
  const bool splits = it->second.splits > 1;
  split.num_splits = it->second.splits;
  split.warps = it->second.warps;
  split.partial_out = splits ? st.active->partial_out.data() : nullptr;
  split.partial_lse = splits ? st.active->partial_lse.data() : nullptr;
  split.counters = splits ? st.active->split_counters.data() : nullptr;
  split.num_tokens = st.num_tokens;
  ck::launch_decode(p, split, st.stream);
}

void CudaAttentionBackend::run_prefill(const CudaAttentionPlan& plan, const TensorView& q, const TensorView& out,
                                       const AttentionLayer& layer, const MHAKVPool& pool,
                                       const ForwardOptions& options) {
  State& st = *state_;
  const bool local = layer.use_local_attention;
  ck::AttentionParams p = cuda_layer_params(q, out, layer, pool, options, options_.page_size);
  p.sinks = device_sinks(layer);
  p.custom_mask = st.has_custom_mask ? st.active->custom_mask.data() : nullptr;
  p.mask_offsets = st.has_custom_mask ? st.active->mask_offsets.data() : nullptr;
  ck::PrefillWork work{};
  if (local) {
    p.num_seqs = st.local_num_seqs;
    p.cu_seqlens_q = st.local_cu_q.data();
    p.seq_lens_k = st.local_kv_lens.data();
    p.page_table = st.local_pages.data();
    p.page_table_stride = st.local_stride;
    work.items = st.local_items.data();
    work.num_items = st.local_num_items;
  } else {
    p.num_seqs = st.num_seqs;
    p.cu_seqlens_q = st.active->cu_q.data();
    p.seq_lens_k = st.active->kv_lens.data();
    p.page_table = st.active->pages.data();
    p.page_table_stride = st.page_table_stride;
    work.items = st.active->items.data();
    work.num_items = st.num_items;
  }
  work.heads_per_group = plan.heads_per_group;
  if (plan.kernel == CudaAttentionKernel::kPrefillWgmma) {
    ck::launch_prefill_wgmma(p, work, st.stream);
  } else {
    SPECULA_ASSERT(plan.kernel == CudaAttentionKernel::kPrefillMma, "run_prefill given kernel {}",
                   static_cast<int>(plan.kernel));
    ck::launch_prefill_mma(p, work, st.stream);
  }
}

void CudaAttentionBackend::forward_draft_tree(const TensorView& q, const TensorView& out, const AttentionLayer& layer,
                                              MHAKVPool& kv_pool, const DraftTreeView& tree) {
  const int64_t rows = q.size(0);
  check_shape(q, {rows, layer.num_q_heads, layer.head_dim}, "q");
  check_shape(out, {rows, layer.num_q_heads, layer.head_dim}, "attention output");
  check_dtype(out, q.dtype(), "attention output");
  check_device(q, options_.device, "q");
  check_device(out, options_.device, "attention output");
  CudaAttentionShape shape = base_shape();
  shape.rows_contiguous = dense_rows(q, layer) && dense_rows(out, layer);
  const CudaAttentionPlan plan = select_cuda_draft_tree(layer, q.dtype(), kv_pool.dtype(), shape);
  SPECULA_CHECK(plan.supported(), "cuda attention backend cannot run the draft tree of layer {}: {}", layer.layer_id,
                plan.unsupported_reason);
  SPECULA_CHECK(kv_pool.config().device == options_.device, "the KV pool is on {}, the backend on {}",
                kv_pool.config().device.str(), options_.device.str());
  SPECULA_CHECK(kv_pool.config().num_kv_heads == layer.num_kv_heads && kv_pool.config().head_dim == layer.head_dim,
                "layer {} has {} KV heads of dim {}, but the KV pool holds {} heads of dim {}", layer.layer_id,
                layer.num_kv_heads, layer.head_dim, kv_pool.config().num_kv_heads, kv_pool.config().head_dim);
  SPECULA_CHECK(rows <= std::numeric_limits<int32_t>::max(), "{} draft tree rows exceed the tree kernel's {}", rows,
                std::numeric_limits<int32_t>::max());
  SPECULA_CHECK(tree.rows_per_seq >= 1 && tree.page_stride >= 0 && tree.branch_stride >= 0,
                "draft tree: rows_per_seq {}, page_stride {}, branch_stride {}; need rows_per_seq >= 1 and strides "
                ">= 0", tree.rows_per_seq, tree.page_stride, tree.branch_stride);
  SPECULA_CHECK(tree.prefix_lens != nullptr && (tree.prefix_pages != nullptr || tree.page_stride == 0) &&
                    (tree.branch_slots != nullptr || tree.branch_stride == 0),
                "draft tree: prefix_lens, prefix_pages (with page_stride > 0) and branch_slots (with branch_stride > "
                "0) must be device arrays, not null");
  SPECULA_CHECK(tree.branch_lens != nullptr || (tree.branch_len >= 0 && tree.branch_len <= tree.branch_stride),
                "draft tree: branch_len {} must be in [0, branch_stride = {}]", tree.branch_len, tree.branch_stride);
  launch_tree(q, out, layer, kv_pool, tree, ForwardOptions{});
}

void CudaAttentionBackend::init_cuda_graph_state(int max_bs, int max_num_tokens) {
  State& st = *state_;
  SPECULA_CHECK(max_bs >= 1 && max_num_tokens >= max_bs, "init_cuda_graph_state({}, {}): need 1 <= max_bs <= max_num_tokens",
                max_bs, max_num_tokens);
  SPECULA_CHECK(options_.max_context_len > 0, "CUDA graphs need AttentionBackendOptions::max_context_len");
  SPECULA_CHECK(!layouts_.empty(), "init_cuda_graph_state needs every layer passed to check_layer first");
  st.graph_max_bs = max_bs;
  st.graph_pages_stride = (options_.max_context_len + options_.page_size - 1) / options_.page_size;
  State::StepArrays& g = st.graph;
  g.cu_q.reserve(static_cast<size_t>(max_bs) + 1, st.device);
  g.kv_lens.reserve(static_cast<size_t>(max_bs), st.device);
  g.pages.reserve(static_cast<size_t>(max_bs) * st.graph_pages_stride, st.device);
  g.out_loc.reserve(static_cast<size_t>(max_num_tokens), st.device);
  // TARGET_VERIFY: at most one work item per query row, and a mask row of at most
  // max_context_len keys per query row.
  g.items.reserve(2 * static_cast<size_t>(max_num_tokens), st.device);
  g.mask_offsets.reserve(static_cast<size_t>(max_bs), st.device);
  g.custom_mask.reserve(static_cast<size_t>(max_num_tokens) * options_.max_context_len, st.device);
  const size_t tree_width = static_cast<size_t>(max_num_tokens / max_bs);
  g.tree_slots.reserve(static_cast<size_t>(max_num_tokens) * tree_width, st.device);
  g.tree_lens.reserve(static_cast<size_t>(max_num_tokens), st.device);
  g.prefix_lens.reserve(static_cast<size_t>(max_bs), st.device);
  // Decode: the workspace stage_decode asks for at every batch size a graph may replay with.
  DecodeWorkspace largest;
  for (int bs = 1; bs <= max_bs; ++bs) {
    DecodeWorkspace workspace;
    plan_decode_step(decode_shape(bs, bs, options_.max_context_len), workspace);
    largest.cover(workspace);
  }
  g.partial_lse.reserve(largest.partial_rows, st.device);
  g.partial_out.reserve(largest.partial_values, st.device);
  g.split_counters.reserve_zeroed(largest.counters, st.device, st.stream);
  for (auto* a : {&g.cu_q, &g.kv_lens, &g.pages, &g.out_loc, &g.items, &g.tree_slots, &g.tree_lens, &g.prefix_lens}) {
    a->freeze();
  }
  g.partial_lse.freeze();
  g.partial_out.freeze();
  g.split_counters.freeze();
  g.mask_offsets.freeze();
  g.custom_mask.freeze();
  st.graph_mode = true;
}

void CudaAttentionBackend::init_forward_metadata_capture_cuda_graph(const ForwardBatch& batch) {
  SPECULA_CHECK(state_->graph_mode, "call init_cuda_graph_state before capturing");
  build_metadata(batch, true);
}

void CudaAttentionBackend::init_forward_metadata_replay_cuda_graph(const ForwardBatch& batch) {
  SPECULA_CHECK(state_->graph_mode, "call init_cuda_graph_state before replaying");
  build_metadata(batch, true);
}

}  // namespace specula
