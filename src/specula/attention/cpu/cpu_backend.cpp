// CpuAttentionBackend: metadata building (sequence descriptors, page table, local-attention
// virtual batches), argument checks, the KV write, and the kernel launch.
#include "specula/attention/cpu/cpu_backend.h"
#include "specula/attention/cpu/dual_chunk.h"

#include <algorithm>
#include <cstdlib>
#include <string_view>

#include "specula/core/error.h"
#include "specula/core/thread_pool.h"
#include "specula/kv/mha_kv_pool.h"
#include "specula/kv/req_to_token_pool.h"

namespace specula {

namespace {

constexpr int kSupportedHeadDims[] = {64, 80, 96, 128, 256};

bool head_dim_supported(int d) {
  return std::find(std::begin(kSupportedHeadDims), std::end(kSupportedHeadDims), d) != std::end(kSupportedHeadDims);
}

CpuIsa isa_from_environment() {
  const char* env = std::getenv("SPECULA_CPU_ISA");
  if (env == nullptr) return best_cpu_isa();
  const std::string_view value(env);
  if (value == "generic") return CpuIsa::generic;
  if (value == "avx512") {
    SPECULA_CHECK(best_cpu_isa() == CpuIsa::avx512, "SPECULA_CPU_ISA=avx512 but this processor lacks AVX-512");
    return CpuIsa::avx512;
  }
  SPECULA_CHECK(false, "SPECULA_CPU_ISA='{}' is not valid; expected generic or avx512", value);
  return CpuIsa::generic;
}

}  // namespace

CpuKernelChoice select_cpu_attention_kernel(const AttentionLayer& layer, DType q_dtype, DType kv_dtype,
                                            int page_size) {
  CpuKernelChoice choice;
  auto fail = [&](std::string reason) {
    choice.unsupported_reason = std::move(reason);
    return choice;
  };
  if (!head_dim_supported(layer.head_dim)) {
    return fail(fmt::format("head_dim {} is not supported; supported: {}", layer.head_dim,
                            fmt::join(kSupportedHeadDims, ", ")));
  }
  if (!head_dim_supported(layer.effective_v_head_dim())) {
    return fail(fmt::format("v_head_dim {} is not supported; supported: {}", layer.effective_v_head_dim(),
                            fmt::join(kSupportedHeadDims, ", ")));
  }
  if (std::string problem = common_layer_problem(layer); !problem.empty()) return fail(std::move(problem));
  if (q_dtype != DType::f32 && q_dtype != DType::bf16 && q_dtype != DType::f16) {
    return fail(fmt::format("query dtype {} is not supported; supported: f32, bf16, f16", dtype_name(q_dtype)));
  }
  if (kv_dtype != DType::f32 && kv_dtype != DType::bf16 && kv_dtype != DType::f16 && kv_dtype != DType::fp8_e4m3) {
    return fail(fmt::format("KV cache dtype {} is not supported; supported: f32, bf16, f16, fp8_e4m3",
                            dtype_name(kv_dtype)));
  }
  if (page_size < 1 || (page_size & (page_size - 1)) != 0) {
    return fail(fmt::format("page_size {} is not supported; it must be a power of two >= 1", page_size));
  }
  if (layer.dca_chunk_len > 0 && (layer.attn_type != AttentionType::DECODER || layer.sliding_window_size >= 0 ||
                                  layer.use_local_attention || !layer.sinks.empty())) {
    return fail("dual chunk attention serves causal layers without sliding window, local chunks or sinks");
  }
  return choice;
}

CpuAttentionBackend::CpuAttentionBackend(const AttentionBackendOptions& options)
    : options_(options),
      pool_(options.thread_pool != nullptr ? options.thread_pool : &default_thread_pool()),
      isa_(isa_from_environment()) {
  SPECULA_CHECK(options.device.is_cpu(), "the cpu attention backend cannot run on {}", options.device.str());
  SPECULA_CHECK(options.page_size >= 1 && (options.page_size & (options.page_size - 1)) == 0,
                "page_size {} is not valid; it must be a power of two >= 1", options.page_size);
  SPECULA_CHECK(options.attention_chunk_size == 0 || options.attention_chunk_size % options.page_size == 0,
                "attention_chunk_size {} is not valid; it must be a multiple of page_size {}",
                options.attention_chunk_size, options.page_size);
}

void CpuAttentionBackend::check_layer(const AttentionLayer& layer, DType q_dtype, DType kv_dtype) const {
  const CpuKernelChoice choice = select_cpu_attention_kernel(layer, q_dtype, kv_dtype, options_.page_size);
  SPECULA_CHECK(choice.unsupported_reason.empty(), "cpu attention backend cannot serve layer {}: {}",
                layer.layer_id, choice.unsupported_reason);
  SPECULA_CHECK(!layer.use_local_attention || options_.attention_chunk_size > 0,
                "layer {} uses local attention but the backend has no attention_chunk_size", layer.layer_id);
  layouts_.insert({layer.num_q_heads, layer.num_kv_heads, layer.use_local_attention});
}

void CpuAttentionBackend::init_forward_metadata(const ForwardBatch& batch) {
  batch.validate();
  Metadata md;
  md.mode = batch.forward_mode;
  md.batch = &batch;
  md.num_tokens = batch.num_tokens();
  if (batch.forward_mode == ForwardMode::IDLE || batch.batch_size == 0) {
    metadata_ = std::move(md);
    return;
  }
  SPECULA_CHECK(batch.req_to_token_pool != nullptr && batch.token_to_kv_pool != nullptr,
                "the batch has no req_to_token_pool or KV pool");
  const int bs = batch.batch_size;
  std::vector<int32_t> kv_lens(static_cast<size_t>(bs));
  std::vector<int32_t> q_lens(static_cast<size_t>(bs));
  for (int i = 0; i < bs; ++i) {
    kv_lens[static_cast<size_t>(i)] = batch.kv_len(i);
    q_lens[static_cast<size_t>(i)] = batch.query_len(i);
  }
  const int page_size = options_.page_size;
  md.page_table = build_page_table(*batch.req_to_token_pool, batch.req_pool_indices, kv_lens, page_size);
  const int64_t num_slots = batch.token_to_kv_pool->num_slots();
  for (int i = 0; i < bs; ++i) {
    const int32_t num_pages = (kv_lens[static_cast<size_t>(i)] + page_size - 1) / page_size;
    for (int32_t pg = 0; pg < num_pages; ++pg) {
      const int64_t page = md.page_table.row(i)[pg];
      SPECULA_CHECK(page >= 0 && (page + 1) * page_size <= num_slots,
                    "request {}: page {} of its KV (page id {}) is outside the KV pool of {} slots", i, pg,
                    page, num_slots);
    }
  }

  const std::vector<int32_t> cu_q = cumulative_lens(q_lens);
  int64_t mask_offset = 0;
  for (int i = 0; i < bs; ++i) {
    const auto ui = static_cast<size_t>(i);
    md.seqs.push_back({cu_q[ui], q_lens[ui], kv_lens[ui], kv_lens[ui] - q_lens[ui], md.page_table.row(i), mask_offset});
    mask_offset += static_cast<int64_t>(q_lens[ui]) * kv_lens[ui];
  }

  if (options_.attention_chunk_size > 0) {
    LocalAttentionBatches local = make_local_attention_virtual_batches(
        options_.attention_chunk_size, cu_q, kv_lens, md.page_table.pages, md.page_table.max_pages, page_size);
    md.local_page_storage = std::move(local.block_table_local);
    for (int vi = 0; vi < local.num_virtual(); ++vi) {
      const auto uv = static_cast<size_t>(vi);
      const int32_t q_len = local.seqlens_q_local[uv];
      const int32_t k_len = local.seqlens_k_local[uv];
      md.local_seqs.push_back({local.cu_seqlens_q_local[uv], q_len, k_len, k_len - q_len,
                               md.local_page_storage.data() + uv * static_cast<size_t>(local.pages_per_local_batch),
                               0});
    }
  }
  for (const HeadLayout& layout : layouts_) {
    const auto& [num_q_heads, num_kv_heads, local] = layout;
    if (local && options_.attention_chunk_size == 0) continue;
    md.plans.emplace(layout, plan_cpu_attention(local ? md.local_seqs : md.seqs, num_q_heads, num_kv_heads));
  }
  metadata_ = std::move(md);
}

void CpuAttentionBackend::forward_extend(const TensorView& q, const TensorView& k, const TensorView& v,
                                         const TensorView& out, const AttentionLayer& layer,
                                         const ForwardBatch& batch, const ForwardOptions& options) {
  SPECULA_CHECK(is_extend_like(batch.forward_mode), "forward_extend called for a {} batch",
                forward_mode_name(batch.forward_mode));
  run(q, k, v, out, layer, batch, options);
}

void CpuAttentionBackend::forward_decode(const TensorView& q, const TensorView& k, const TensorView& v,
                                         const TensorView& out, const AttentionLayer& layer,
                                         const ForwardBatch& batch, const ForwardOptions& options) {
  SPECULA_CHECK(batch.forward_mode == ForwardMode::DECODE, "forward_decode called for a {} batch",
                forward_mode_name(batch.forward_mode));
  run(q, k, v, out, layer, batch, options);
}

void CpuAttentionBackend::run(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                              const AttentionLayer& layer, const ForwardBatch& batch, const ForwardOptions& options) {
  SPECULA_CHECK(metadata_.batch == &batch && metadata_.mode == batch.forward_mode &&
                    metadata_.num_tokens == batch.num_tokens(),
                "init_forward_metadata was not called for this batch before forward");
  if (batch.batch_size == 0) return;
  MHAKVPool& pool = *batch.token_to_kv_pool;
  check_layer(layer, q.dtype(), pool.dtype());
  const int64_t n = batch.num_tokens();
  const int Dv = layer.effective_v_head_dim();
  const bool dual_chunk = layer.dca_chunk_len > 0;
  check_shape(q, {n, layer.num_q_heads, layer.dca_q_variants() * layer.head_dim}, "q");
  check_shape(out, {n, layer.num_q_heads, Dv}, "attention output");
  SPECULA_CHECK(q.stride(2) == 1 && out.stride(2) == 1, "q {} and output {} need contiguous head_dim", q.str(),
                out.str());
  SPECULA_CHECK(out.dtype() == DType::f32 || out.dtype() == DType::bf16 || out.dtype() == DType::f16,
                "attention output dtype {} is not supported; supported: f32, bf16, f16", dtype_name(out.dtype()));
  SPECULA_CHECK(pool.config().num_kv_heads == layer.num_kv_heads && pool.config().head_dim == layer.head_dim &&
                    pool.config().v_head_dim == Dv,
                "layer {} has {} KV heads of dim {}/{}, but the KV pool holds {} heads of dim {}/{}",
                layer.layer_id, layer.num_kv_heads, layer.head_dim, Dv, pool.config().num_kv_heads,
                pool.config().head_dim, pool.config().v_head_dim);
  if (options.lse.defined()) {
    check_shape(options.lse, {n, layer.num_q_heads}, "lse");
    check_dtype(options.lse, DType::f32, "lse");
    SPECULA_CHECK(options.lse.stride(1) == 1, "lse {} needs contiguous heads", options.lse.str());
  }
  if (options.save_kv_cache) {
    pool.set_kv_buffer(layer.layer_id, batch.out_cache_loc, k, v);
  }
  if (n == 0) return;

  const bool custom = batch.forward_mode == ForwardMode::TARGET_VERIFY && !batch.spec_info->custom_mask.empty();
  const bool local = layer.use_local_attention;
  SPECULA_CHECK(!(local && custom), "layer {}: local attention with a tree mask is not supported", layer.layer_id);
  const std::vector<CpuAttentionSeq>& seqs = local ? metadata_.local_seqs : metadata_.seqs;

  CpuAttentionParams p{};
  p.q = q.data();
  p.q_dtype = q.dtype();
  p.q_stride_token = q.stride(0);
  p.q_stride_head = q.stride(1);
  p.out = out.data();
  p.out_dtype = out.dtype();
  p.out_stride_token = out.stride(0);
  p.out_stride_head = out.stride(1);
  p.lse = options.lse.defined() ? options.lse.data_as<float>() : nullptr;
  p.lse_stride_token = options.lse.defined() ? options.lse.stride(0) : 0;
  p.k_cache = pool.k_buffer(layer.layer_id).data();
  p.v_cache = pool.v_buffer(layer.layer_id).data();
  p.kv_dtype = pool.dtype();
  const bool fp8 = pool.dtype() == DType::fp8_e4m3;
  p.k_descale = fp8 ? pool.k_scale(layer.layer_id) : 1.0f;
  p.v_descale = fp8 ? pool.v_scale(layer.layer_id) : 1.0f;
  p.num_q_heads = layer.num_q_heads;
  p.num_kv_heads = layer.num_kv_heads;
  p.head_dim = layer.head_dim;
  p.v_head_dim = Dv;
  p.page_size = options_.page_size;
  p.scale = layer.effective_scaling();
  p.logit_cap = layer.logit_cap;
  p.window_left = layer.sliding_window_size;
  p.causal = layer.attn_type == AttentionType::DECODER;
  p.sinks = layer.sinks.empty() ? nullptr : layer.sinks.data();
  p.custom_mask = custom ? batch.spec_info->custom_mask.data() : nullptr;

  if (dual_chunk) {
    SPECULA_CHECK(!custom, "layer {}: dual chunk attention with a tree mask (speculative verify) is not supported",
                  layer.layer_id);
    // Decode rows attend densely, as vLLM's decode path does; the sparse pattern is prefill's.
    const bool prefill = batch.forward_mode == ForwardMode::EXTEND || batch.forward_mode == ForwardMode::MIXED;
    run_dual_chunk_attention(isa_, p,
                             DualChunkShape{layer.dca_chunk_len, layer.dca_original_max_position,
                                            layer.dca_sparse.get(), prefill},
                             seqs, metadata_.dual_chunk_parts, scratch_, *pool_);
    return;
  }
  const auto it = metadata_.plans.find(HeadLayout{layer.num_q_heads, layer.num_kv_heads, local});
  SPECULA_CHECK(it != metadata_.plans.end(),
                "layer {} ({} query / {} KV heads) was not passed to check_layer before init_forward_metadata",
                layer.layer_id, layer.num_q_heads, layer.num_kv_heads);
  run_cpu_attention(isa_, p, seqs, it->second, scratch_, *pool_);
}

}  // namespace specula
