// CudaAttentionBackend: host-side planning once per step (sequence descriptors, page table,
// prefill work items, local-attention virtual batches, decode split counts), uploads into
// device buffers that grow on demand (and are frozen in CUDA-graph mode so captured kernels
// keep valid pointers), the KV write, and the kernel launches.
#include "specula/attention/cuda/cuda_backend.h"

#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <string>
#include <utility>
#include <vector>
#include <cuda_runtime_api.h>

#include <algorithm>

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

namespace {

namespace ck = cuda_kernels;

constexpr int kSupportedHeadDims[] = {64, 80, 96, 128, 256};

int head_blocks(int num_q_heads, int num_kv_heads) {
  const int group = num_q_heads / num_kv_heads;
  return (group + ck::kDecodeHeadsPerBlock - 1) / ck::kDecodeHeadsPerBlock;
}

}  // namespace

std::string cuda_attention_unsupported_reason(const AttentionLayer& layer, DType q_dtype, DType kv_dtype, int page_size) {
  if (std::find(std::begin(kSupportedHeadDims), std::end(kSupportedHeadDims), layer.head_dim) == std::end(kSupportedHeadDims)) {
    return fmt::format("head_dim {} is not supported; supported: {}", layer.head_dim, fmt::join(kSupportedHeadDims, ", "));
  }
  if (layer.effective_v_head_dim() != layer.head_dim) {
    return fmt::format("v_head_dim {} differs from head_dim {}; the cuda backend needs them equal",
                       layer.effective_v_head_dim(), layer.head_dim);
  }
  if (std::string problem = common_layer_problem(layer); !problem.empty()) return problem;
  if (q_dtype != DType::bf16 && q_dtype != DType::f16) {
    return fmt::format("query dtype {} is not supported; supported: bf16, f16", dtype_name(q_dtype));
  }
  if (kv_dtype != DType::bf16 && kv_dtype != DType::f16 && kv_dtype != DType::fp8_e4m3) {
    return fmt::format("KV cache dtype {} is not supported; supported: bf16, f16, fp8_e4m3", dtype_name(kv_dtype));
  }
  if (page_size < 1 || (page_size & (page_size - 1)) != 0) {
    return fmt::format("page_size {} is not supported; it must be a power of two >= 1", page_size);
  }
  return {};
}

DecodePlan choose_decode_plan(int batch_size, int kv_head_blocks, int max_kv_len, int num_sms) {
  const int64_t blocks = static_cast<int64_t>(batch_size) * kv_head_blocks;
  if (blocks <= 0 || blocks >= num_sms) return {};
  DecodePlan plan;
  int64_t want = 0;
  if (2 * blocks <= num_sms) {
    // One wide block per multiprocessor (128 blocks at B=1 with 8 KV heads, so 4 of 132 idle).
    // H200, B=1 L=32768, cold L2, KV TB/s (page 16 / 64): 33 splits of 4 warps, two blocks per
    // multiprocessor, 2.94 / 2.98; 16 splits of 8 warps 3.06-3.10 / 3.12-3.13. Their key loops
    // end 30-36 us into the kernel, the 4-warp blocks' 18-37 us.
    plan.warps = ck::kDecodeWideWarps;
    want = num_sms / blocks;
  } else {
    // About two blocks per multiprocessor: what the 4-warp kernel keeps resident at head_dim
    // 96-128 with 16-bit caches (fp8 and smaller heads fit more, head_dim 256 one).
    want = (2 * static_cast<int64_t>(num_sms) + blocks - 1) / blocks;
  }
  const int64_t by_length = std::max<int64_t>(1, (max_kv_len + 255) / 256);
  plan.splits = static_cast<int>(std::clamp<int64_t>(std::min(want, by_length), 1, ck::kMaxDecodeSplits));
  if (plan.splits == 1) plan.warps = 4;
  return plan;
}

struct CudaAttentionBackend::State {
  Device device;
  cudaStream_t stream = nullptr;
  UploadBatch uploads{Device::cpu()};  // the step's metadata, flushed once per build_metadata

  ForwardMode mode = ForwardMode::IDLE;
  const ForwardBatch* batch = nullptr;
  int64_t num_tokens = 0;
  int num_seqs = 0;
  int page_table_stride = 0;
  int max_kv_len = 0;
  int num_items = 0;
  int local_num_seqs = 0;
  int local_stride = 0;
  int local_num_items = 0;
  int64_t kv_rows = 0;        // K/V rows the step's sequences attend (the local batches' with chunking)
  int64_t local_kv_rows = 0;
  bool has_custom_mask = false;
  bool tree_path = false;  // TARGET_VERIFY with a visible prefix: the tree kernel's arrays are set
  int tree_rows_per_seq = 0;
  std::map<HeadLayout, DecodePlan> decode_plans;

  // Per-step arrays every mode uses: one set for eager steps (grows freely) and one for CUDA
  // graphs (sized once, frozen, so captured kernels keep valid pointers).
  struct StepArrays {
    DeviceArray<int32_t> cu_q, kv_lens, pages, out_loc, items;
    DeviceArray<int32_t> tree_slots, tree_lens, prefix_lens;  // TARGET_VERIFY through the tree kernel
    DeviceArray<float> partial_out, partial_lse;
    DeviceArray<uint32_t> split_counters;  // decode.cu's merge counts; zero between launches
    DeviceArray<int64_t> mask_offsets;
    DeviceArray<uint8_t> custom_mask;
  };
  StepArrays eager;
  StepArrays graph;
  StepArrays* active = &eager;
  DeviceArray<int32_t> local_cu_q, local_kv_lens, local_pages, local_items;
  // Sinks per layer id, uploaded once (and again only if the values change).
  std::map<int, std::pair<std::vector<float>, Buffer>> sinks;

  bool graph_mode = false;
  int graph_max_bs = 0;
  int graph_pages_stride = 0;
  int max_q_heads = 0;
  int max_head_dim = 0;
};

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

void CudaAttentionBackend::check_layer(const AttentionLayer& layer, DType q_dtype, DType kv_dtype) const {
  const std::string reason = cuda_attention_unsupported_reason(layer, q_dtype, kv_dtype, options_.page_size);
  SPECULA_CHECK(reason.empty(), "cuda attention backend cannot serve layer {}: {}", layer.layer_id, reason);
  SPECULA_CHECK(!layer.use_local_attention || options_.attention_chunk_size > 0,
                "layer {} uses local attention but the backend has no attention_chunk_size", layer.layer_id);
  layouts_.insert({layer.num_q_heads, layer.num_kv_heads, layer.use_local_attention});
  all_layers_tree_ok_ = all_layers_tree_ok_ && tree_kernel_serves(layer, q_dtype, kv_dtype);
  state_->max_q_heads = std::max(state_->max_q_heads, layer.num_q_heads);
  state_->max_head_dim = std::max(state_->max_head_dim, layer.head_dim);
}

void CudaAttentionBackend::init_forward_metadata(const ForwardBatch& batch) { build_metadata(batch, false); }

bool CudaAttentionBackend::tree_kernel_serves(const AttentionLayer& layer, DType q_dtype, DType kv_dtype) {
  return q_dtype == DType::bf16 && kv_dtype == DType::bf16 &&
         (layer.head_dim == 64 || layer.head_dim == 128 || layer.head_dim == 256) && layer.logit_cap == 0.0f &&
         layer.sinks.empty() && layer.sliding_window_size < 0 && !layer.use_local_attention &&
         layer.attn_type == AttentionType::DECODER;
}

DecodePlan CudaAttentionBackend::plan_decode(int batch_size, int kv_head_blocks, int max_kv_len) const {
  // Deterministic: the same split of every request's keys whatever the batch and its lengths.
  if (options_.deterministic) return choose_decode_plan(1, kv_head_blocks, options_.max_context_len, num_sms_);
  return choose_decode_plan(batch_size, kv_head_blocks, max_kv_len, num_sms_);
}

void CudaAttentionBackend::build_metadata(const ForwardBatch& batch, bool graph) {
  state_->uploads.clear();
  stage_metadata(batch, graph);
  state_->uploads.flush(state_->stream);
}

void CudaAttentionBackend::stage_metadata(const ForwardBatch& batch, bool graph) {
  State& st = *state_;
  batch.validate();
  SPECULA_CHECK(!graph || batch.forward_mode == ForwardMode::DECODE || batch.forward_mode == ForwardMode::TARGET_VERIFY,
                "CUDA graphs of the cuda attention backend cover DECODE and TARGET_VERIFY steps; got {}",
                forward_mode_name(batch.forward_mode));
  SPECULA_CHECK(!graph || options_.attention_chunk_size == 0,
                "CUDA graphs of TARGET_VERIFY steps do not support local chunked attention");
  st.active = graph ? &st.graph : &st.eager;
  State::StepArrays& arrays = *st.active;
  st.mode = batch.forward_mode;
  st.batch = &batch;
  st.num_tokens = batch.num_tokens();
  st.num_seqs = batch.batch_size;
  st.num_items = 0;
  st.local_num_seqs = 0;
  st.local_num_items = 0;
  st.has_custom_mask = false;
  st.tree_path = false;
  st.decode_plans.clear();
  if (batch.forward_mode == ForwardMode::IDLE || batch.batch_size == 0) return;
  SPECULA_CHECK(batch.req_to_token_pool != nullptr && batch.token_to_kv_pool != nullptr,
                "the batch has no req_to_token_pool or KV pool");
  SPECULA_CHECK(batch.token_to_kv_pool->config().device == options_.device, "the KV pool is on {}, the backend on {}",
                batch.token_to_kv_pool->config().device.str(), options_.device.str());

  const int bs = batch.batch_size;
  const int page_size = options_.page_size;
  std::vector<int32_t> kv_lens(static_cast<size_t>(bs)), q_lens(static_cast<size_t>(bs));
  for (int i = 0; i < bs; ++i) {
    kv_lens[static_cast<size_t>(i)] = batch.kv_len(i);
    q_lens[static_cast<size_t>(i)] = batch.query_len(i);
  }
  st.max_kv_len = *std::max_element(kv_lens.begin(), kv_lens.end());
  st.kv_rows = std::accumulate(kv_lens.begin(), kv_lens.end(), int64_t{0});
  const PageTable table = build_page_table(*batch.req_to_token_pool, batch.req_pool_indices, kv_lens, page_size);
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
  const std::vector<int32_t> cu_q = cumulative_lens(q_lens);
  arrays.cu_q.upload(cu_q, st.device, st.uploads);
  arrays.kv_lens.upload(kv_lens, st.device, st.uploads);
  arrays.pages.upload(pages, st.device, st.uploads);
  arrays.out_loc.upload(batch.out_cache_loc, st.device, st.uploads);

  if (batch.forward_mode == ForwardMode::DECODE) {
    const int len_for_plan = graph ? options_.max_context_len : st.max_kv_len;
    int max_splits = 1;
    for (const HeadLayout& layout : layouts_) {
      const auto& [hq, hkv, local] = layout;
      const DecodePlan plan = plan_decode(bs, hkv * head_blocks(hq, hkv), len_for_plan);
      st.decode_plans[layout] = plan;
      max_splits = std::max(max_splits, plan.splits);
    }
    if (max_splits > 1) {
      const size_t rows = static_cast<size_t>(max_splits) * static_cast<size_t>(st.num_tokens) * st.max_q_heads;
      arrays.partial_lse.reserve(rows, st.device);
      arrays.partial_out.reserve(rows * st.max_head_dim, st.device);
      arrays.split_counters.reserve_zeroed(static_cast<size_t>(st.num_tokens) * st.max_q_heads, st.device,
                                           st.stream);
    }
    return;
  }

  // Extend-like modes: tiles of kPrefillTileRows query rows.
  std::vector<int32_t> items;
  for (int i = 0; i < bs; ++i) {
    for (int q = 0; q < q_lens[static_cast<size_t>(i)]; q += ck::kPrefillTileRows) {
      items.push_back(i);
      items.push_back(q);
    }
  }
  st.num_items = static_cast<int>(items.size() / 2);
  arrays.items.upload(items, st.device, st.uploads);
  // A captured verify step always reads a tree mask whose prefix is visible (its kernels were
  // recorded with one).
  SPECULA_CHECK(!graph || (!batch.spec_info->custom_mask.empty() && batch.spec_info->prefix_visible),
                "a CUDA-graph TARGET_VERIFY step needs its tree mask, with the prefix visible");
  if (batch.forward_mode == ForwardMode::TARGET_VERIFY && !batch.spec_info->custom_mask.empty()) {
    const std::vector<uint8_t>& mask = batch.spec_info->custom_mask;
    std::vector<int64_t> offsets(static_cast<size_t>(bs));
    int64_t offset = 0;
    for (int i = 0; i < bs; ++i) {
      offsets[static_cast<size_t>(i)] = offset;
      offset += static_cast<int64_t>(q_lens[static_cast<size_t>(i)]) * kv_lens[static_cast<size_t>(i)];
    }
    if (batch.spec_info->prefix_visible) {
      // Per query row: the slots of the tree tokens its mask row shows.
      const int N = batch.spec_info->num_draft_tokens;
      std::vector<int32_t> slots(static_cast<size_t>(st.num_tokens) * N, 0), lens(static_cast<size_t>(st.num_tokens));
      for (int i = 0; i < bs; ++i) {
        const int32_t prefix = batch.seq_lens[static_cast<size_t>(i)];
        const int32_t kv = kv_lens[static_cast<size_t>(i)];
        for (int q = 0; q < N; ++q) {
          const int64_t row = static_cast<int64_t>(i) * N + q;
          const uint8_t* m = mask.data() + offsets[static_cast<size_t>(i)] + static_cast<int64_t>(q) * kv + prefix;
          int count = 0;
          for (int j = 0; j < N; ++j) {
            if (m[j] != 0) slots[static_cast<size_t>(row * N + count++)] = batch.out_cache_loc[static_cast<size_t>(i * N + j)];
          }
          lens[static_cast<size_t>(row)] = count;
        }
      }
      arrays.tree_slots.upload(slots, st.device, st.uploads);
      arrays.tree_lens.upload(lens, st.device, st.uploads);
      arrays.prefix_lens.upload(batch.seq_lens, st.device, st.uploads);
      st.tree_path = true;
      st.tree_rows_per_seq = N;
    }
    // The full mask only when some layer attends through the prefill kernel.
    if (!st.tree_path || !all_layers_tree_ok_) {
      arrays.mask_offsets.upload(offsets, st.device, st.uploads);
      arrays.custom_mask.upload(mask, st.device, st.uploads);
      st.has_custom_mask = true;
    }
  }
  if (options_.attention_chunk_size > 0) {
    const LocalAttentionBatches local = make_local_attention_virtual_batches(
        options_.attention_chunk_size, cu_q, kv_lens, table.pages, table.max_pages, page_size);
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
  check_layer(layer, q.dtype(), pool.dtype());
  const int64_t n = st.num_tokens;
  check_shape(q, {n, layer.num_q_heads, layer.head_dim}, "q");
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
  const bool fp8 = pool.dtype() == DType::fp8_e4m3;
  if (options.save_kv_cache) {
    const TensorView loc(st.active->out_loc.data(), DType::i32, {n}, options_.device);
    pool.set_kv_buffer(layer.layer_id, loc, k, v, st.stream);
  }

  if (st.tree_path && tree_kernel_serves(layer, q.dtype(), pool.dtype()) &&
      q.stride(1) == layer.head_dim && q.stride(0) == static_cast<int64_t>(layer.num_q_heads) * layer.head_dim &&
      out.stride(1) == layer.head_dim && out.stride(0) == static_cast<int64_t>(layer.num_q_heads) * layer.head_dim) {
    ck::TreeAttentionParams t{};
    t.q = q.data();
    t.k_cache = pool.k_buffer(layer.layer_id).data();
    t.v_cache = pool.v_buffer(layer.layer_id).data();
    t.out = out.data();
    t.rows = static_cast<int>(n);
    t.rows_per_seq = st.tree_rows_per_seq;
    t.num_q_heads = layer.num_q_heads;
    t.num_kv_heads = layer.num_kv_heads;
    t.head_dim = layer.head_dim;
    t.scale = layer.effective_scaling();
    t.prefix_pages = st.active->pages.data();
    t.page_stride = st.page_table_stride;
    t.page_size = options_.page_size;
    t.prefix_lens = st.active->prefix_lens.data();
    t.branch_slots = st.active->tree_slots.data();
    t.branch_stride = st.tree_rows_per_seq;
    t.branch_len = 0;
    t.branch_lens = st.active->tree_lens.data();
    t.lse = options.lse.defined() ? options.lse.data_as<float>() : nullptr;
    t.lse_stride_token = options.lse.defined() ? options.lse.stride(0) : 0;
    ck::tree_attention(t, st.stream);
    return;
  }
  SPECULA_CHECK(!st.tree_path || st.has_custom_mask,
                "layer {}: this TARGET_VERIFY step was planned for the tree kernel, which cannot serve the layer "
                "(non-contiguous q or output)", layer.layer_id);
  const bool local = layer.use_local_attention;
  const bool decode = batch.forward_mode == ForwardMode::DECODE;
  SPECULA_CHECK(!(local && st.has_custom_mask), "layer {}: local attention with a tree mask is not supported",
                layer.layer_id);
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
  p.page_size = options_.page_size;
  p.scale = layer.effective_scaling();
  p.logit_cap = layer.logit_cap;
  p.window_left = layer.sliding_window_size;
  p.causal = layer.attn_type == AttentionType::DECODER ? 1 : 0;
  p.chunk_size = (decode && local) ? options_.attention_chunk_size : 0;
  p.sinks = nullptr;
  if (!layer.sinks.empty()) {
    auto& [values, buffer] = st.sinks[layer.layer_id];
    if (values != layer.sinks) {
      values = layer.sinks;
      buffer = Buffer(DType::f32, {layer.num_q_heads}, options_.device);
      copy(buffer, TensorView(values.data(), DType::f32, {layer.num_q_heads}));
    }
    p.sinks = buffer.data_as<const float>();
  }
  p.custom_mask = st.has_custom_mask ? st.active->custom_mask.data() : nullptr;
  p.mask_offsets = st.has_custom_mask ? st.active->mask_offsets.data() : nullptr;
  if (local && !decode) {
    p.num_seqs = st.local_num_seqs;
    p.cu_seqlens_q = st.local_cu_q.data();
    p.seq_lens_k = st.local_kv_lens.data();
    p.page_table = st.local_pages.data();
    p.page_table_stride = st.local_stride;
  } else {
    p.num_seqs = st.num_seqs;
    p.cu_seqlens_q = st.active->cu_q.data();
    p.seq_lens_k = st.active->kv_lens.data();
    p.page_table = st.active->pages.data();
    p.page_table_stride = st.page_table_stride;
  }

  if (decode) {
    // The decode kernel indexes cache rows (slot x KV heads + head) in 32 bits.
    SPECULA_CHECK(pool.num_slots() * layer.num_kv_heads <= std::numeric_limits<int32_t>::max(),
                  "KV pool of {} slots x {} KV heads exceeds the decode kernel's {} cache rows", pool.num_slots(),
                  layer.num_kv_heads, std::numeric_limits<int32_t>::max());
    const auto it = st.decode_plans.find(HeadLayout{layer.num_q_heads, layer.num_kv_heads, local});
    SPECULA_CHECK(it != st.decode_plans.end(),
                  "layer {} ({} query / {} KV heads) was not passed to check_layer before init_forward_metadata",
                  layer.layer_id, layer.num_q_heads, layer.num_kv_heads);
    ck::DecodeSplit split{};
    const bool splits = it->second.splits > 1;
    split.num_splits = it->second.splits;
    split.warps = it->second.warps;
    split.partial_out = splits ? st.active->partial_out.data() : nullptr;
    split.partial_lse = splits ? st.active->partial_lse.data() : nullptr;
    split.counters = splits ? st.active->split_counters.data() : nullptr;
    split.num_tokens = n;
    ck::launch_decode(p, split, st.stream);
  } else {
    ck::PrefillWork work{};
    work.items = local ? st.local_items.data() : st.active->items.data();
    work.num_items = local ? st.local_num_items : st.num_items;
    const int64_t kv_bytes = (local ? st.local_kv_rows : st.kv_rows) * 2 * layer.head_dim *
                             static_cast<int64_t>(dtype_size(pool.dtype()));
    work.heads_per_group = ck::prefill_head_group(kv_bytes, layer.num_q_heads, layer.num_kv_heads, l2_bytes_);
    ck::launch_prefill(p, work, st.stream);
  }
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
  size_t rows = 1;
  for (int bs = 1; bs <= max_bs; ++bs) {
    for (const HeadLayout& layout : layouts_) {
      const auto& [hq, hkv, local] = layout;
      const int splits = plan_decode(bs, hkv * head_blocks(hq, hkv), options_.max_context_len).splits;
      if (splits > 1) rows = std::max(rows, static_cast<size_t>(splits) * bs * st.max_q_heads);
    }
  }
  g.partial_lse.reserve(rows, st.device);
  g.partial_out.reserve(rows * st.max_head_dim, st.device);
  g.split_counters.reserve_zeroed(static_cast<size_t>(max_bs) * st.max_q_heads, st.device, st.stream);
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
