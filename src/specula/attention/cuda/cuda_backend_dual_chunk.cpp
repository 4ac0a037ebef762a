// CudaAttentionBackend's dual chunk attention for extend-like steps (dual_chunk_plan.h): the
// step's runs staged, the sparse runs' kept keys selected per layer, the passes launched and merged.
#include <cstdint>
#include <vector>

#include "specula/attention/cuda/cuda_backend.h"
#include "specula/attention/cuda/cuda_backend_state.h"
#include "specula/attention/cuda/kernels/attention_params.h"
#include "specula/attention/cuda/kernels/dual_chunk_merge.h"
#include "specula/attention/cuda/kernels/dual_chunk_sparse.h"
#include "specula/attention/cuda/kernels/prefill_wgmma.h"
#include "specula/core/tensor.h"
#include "specula/core/dtype_code.h"
#include "specula/core/error.h"
#include "specula/kv/mha_kv_pool.h"

namespace specula {

namespace ck = cuda_kernels;

// Dual chunk attention: the runs, passes and their page tables, for every dual chunk layer.
void CudaAttentionBackend::stage_dual_chunk(const Sequences& seqs) {
  State& st = *state_;
  // Sparse rows in prefill and extend steps only, as on the CPU backend.
  const bool sparse_rows = st.mode == ForwardMode::EXTEND || st.mode == ForwardMode::MIXED;
  st.dca = plan_cuda_dual_chunk(dca_chunk_len_, dca_original_max_, options_.page_size, seqs.q_lens, seqs.kv_lens,
                                seqs.table, dca_sparse_ && sparse_rows ? &*dca_sparse_ : nullptr);
  st.dca_cu_q.upload(st.dca.cu_q, st.device, st.uploads);
  st.dca_items.upload(st.dca.items, st.device, st.uploads);
  st.dca_temperature.upload(st.dca.temperature, st.device, st.uploads);
  for (int part = 0; part < st.dca.num_parts; ++part) {
    st.dca_kv_lens[static_cast<size_t>(part)].upload(st.dca.kv_lens[static_cast<size_t>(part)], st.device, st.uploads);
    st.dca_pages[static_cast<size_t>(part)].upload(st.dca.pages[static_cast<size_t>(part)], st.device, st.uploads);
    if (st.dca.num_sparse > 0) {
      st.dca_key_base[static_cast<size_t>(part)].upload(st.dca.key_base[static_cast<size_t>(part)], st.device,
                                                        st.uploads);
    }
  }
  if (st.dca.num_sparse > 0) {
    st.dca_keep_run.upload(st.dca.keep_run, st.device, st.uploads);
    st.dca_q_base.upload(st.dca.q_base, st.device, st.uploads);
    st.dca_sparse_runs.upload(st.dca.sparse_runs, st.device, st.uploads);
    st.dca_sparse_temperature.upload(st.dca.sparse_temperature, st.device, st.uploads);
  }
  st.dca_staged = true;
}

// Dual chunk attention's passes through the prefill kernels (each its q variant, causal for the
// intra pass alone, the temperature per run), then their merge; one pass writes the output itself.
void CudaAttentionBackend::run_dual_chunk(const TensorView& q, const TensorView& out, const AttentionLayer& layer,
                                          const MHAKVPool& pool, const ForwardOptions& options) {
  State& st = *state_;
  const CudaDualChunkPlan& d = st.dca;
  SPECULA_CHECK(st.dca_staged && d.chunk_len == layer.dca_chunk_len &&
                    d.original_max_position == layer.dca_original_max_position,
                "layer {}: dual chunk attention (chunk length {}) was not planned for this step; pass the layer to "
                "check_layer before init_forward_metadata",
                layer.layer_id, layer.dca_chunk_len);
  const int64_t n = st.num_tokens, Hq = layer.num_q_heads, D = layer.head_dim;
  const bool sparse = d.num_sparse > 0 && layer.dca_sparse != nullptr;
  if (sparse) select_dual_chunk_keys(q, layer, pool);
  const bool merged = d.num_parts > 1;
  if (merged) {
    st.dca_parts.reserve(d.num_parts * n * Hq * D, st.device);
    st.dca_lse.reserve(d.num_parts * n * Hq, st.device);
  }
  CudaAttentionShape shape = base_shape();
  for (int part = 0; part < d.num_parts; ++part) {
    shape.kv_rows = d.kv_rows[static_cast<size_t>(part)];
    const CudaAttentionPlan plan = select_cuda_extend(layer, q.dtype(), pool.dtype(), shape);
    SPECULA_CHECK(plan.supported(), "layer {}: {}", layer.layer_id, plan.unsupported_reason);
    ck::AttentionParams p = cuda_layer_params(q, out, layer, pool, options, options_.page_size);
    p.q = static_cast<const char*>(q.data()) + part * D * static_cast<int64_t>(dtype_size(q.dtype()));
    if (sparse) {
      p.keep_run = st.dca_keep_run.data();
      p.key_base = st.dca_key_base[static_cast<size_t>(part)].data();
      p.q_base = st.dca_q_base.data();
      p.keep_cols = st.dca_keep_cols.data();
      p.keep_dists = st.dca_keep_dists.data();
      p.keep_words = ck::keep_words(d.sparse_max_end);
    }
    p.causal = part == 0 ? 1 : 0;
    p.seq_score_scale = st.dca_temperature.data();
    if (merged) {
      p.out = st.dca_parts.data() + part * n * Hq * D;
      p.out_stride_token = Hq * D;
      p.out_stride_head = D;
      p.out_f32 = 1;
      p.lse = st.dca_lse.data() + part * n * Hq;
      p.lse_stride_token = Hq;
    }
    p.num_seqs = d.num_runs;
    p.cu_seqlens_q = st.dca_cu_q.data();
    p.seq_lens_k = st.dca_kv_lens[static_cast<size_t>(part)].data();
    p.page_table = st.dca_pages[static_cast<size_t>(part)].data();
    p.page_table_stride = d.page_stride;
    const ck::PrefillWork work{st.dca_items.data(), static_cast<int32_t>(d.items.size() / 2), plan.heads_per_group};
    if (plan.kernel == CudaAttentionKernel::kPrefillWgmma) {
      ck::launch_prefill_wgmma(p, work, st.stream);
    } else {
      ck::launch_prefill_mma(p, work, st.stream);
    }
  }
  if (!merged) return;
  ck::DualChunkMergeParams m{};
  m.parts = st.dca_parts.data();
  m.part_lse = st.dca_lse.data();
  m.num_parts = d.num_parts;
  m.out = out.data();
  m.out_stride_token = out.stride(0);
  m.out_stride_head = out.stride(1);
  m.io_dtype = kernel_dtype_code(q.dtype());
  m.lse = options.lse.defined() ? options.lse.data_as<float>() : nullptr;
  m.lse_stride_token = options.lse.defined() ? options.lse.stride(0) : 0;
  m.num_tokens = n;
  m.num_heads = static_cast<int32_t>(Hq);
  m.head_dim = static_cast<int32_t>(D);
  ck::launch_dual_chunk_merge(m, st.stream);
}

// The sparse runs' kept keys for this layer's pattern (kernels/dual_chunk_sparse.h): q holds five
// variants per head.
void CudaAttentionBackend::select_dual_chunk_keys(const TensorView& q, const AttentionLayer& layer,
                                                  const MHAKVPool& pool) {
  State& st = *state_;
  const CudaDualChunkPlan& d = st.dca;
  const DualChunkSparsePattern& pattern = *layer.dca_sparse;
  const int Hq = layer.num_q_heads;
  SPECULA_CHECK(static_cast<int>(pattern.vertical.size()) == Hq && static_cast<int>(pattern.slash.size()) == Hq,
                "layer {}: the sparse pattern has {} vertical and {} slash sizes for {} query heads", layer.layer_id,
                pattern.vertical.size(), pattern.slash.size(), Hq);
  std::vector<int32_t> host(pattern.vertical.begin(), pattern.vertical.end());
  host.insert(host.end(), pattern.slash.begin(), pattern.slash.end());
  auto& [values, lines] = st.dca_lines[layer.layer_id];
  if (values != host) {  // uploaded once per layer and set of values
    values = host;
    lines = Buffer(DType::i32, {2 * static_cast<int64_t>(Hq)}, options_.device);
    copy(lines, TensorView(values.data(), DType::i32, {2 * static_cast<int64_t>(Hq)}));
  }
  int64_t partial = 0, lse = 0, scores = 0;
  ck::dual_chunk_sparse_workspace(d.num_sparse, Hq, d.sparse_max_end, partial, lse, scores);
  st.dca_partial.reserve(partial, st.device);
  st.dca_est_lse.reserve(lse, st.device);
  st.dca_vertical.reserve(scores, st.device);
  st.dca_slash.reserve(scores, st.device);
  const int64_t words = static_cast<int64_t>(d.num_sparse) * Hq * ck::keep_words(d.sparse_max_end);
  st.dca_keep_cols.reserve(words, st.device);
  st.dca_keep_dists.reserve(words, st.device);
  const bool fp8 = pool.dtype() == DType::fp8_e4m3;
  ck::DualChunkSparseParams p{};
  p.q = q.data();
  p.q_stride_token = q.stride(0);
  p.q_stride_head = q.stride(1);
  p.q_dtype = kernel_dtype_code(q.dtype());
  p.k_cache = pool.k_buffer(layer.layer_id).data();
  p.kv_dtype = kernel_dtype_code(pool.dtype());
  p.k_descale = fp8 ? pool.k_scale(layer.layer_id) : 1.0f;
  p.num_q_heads = Hq;
  p.num_kv_heads = layer.num_kv_heads;
  p.head_dim = layer.head_dim;
  p.page_size = options_.page_size;
  p.chunk_len = layer.dca_chunk_len;
  p.scale = layer.effective_scaling();
  p.logit_cap = layer.logit_cap;
  p.num_runs = d.num_sparse;
  p.runs = st.dca_sparse_runs.data();
  p.temperature = st.dca_sparse_temperature.data();
  p.pages = st.active->pages.data();
  p.page_stride = st.page_table_stride;
  p.keep_vertical = lines.data_as<const int32_t>();
  p.keep_slash = lines.data_as<const int32_t>() + Hq;
  p.forced_vertical = pattern.forced_vertical;
  p.forced_slash = pattern.forced_slash;
  p.max_end = d.sparse_max_end;
  p.partial = st.dca_partial.data();
  p.lse = st.dca_est_lse.data();
  p.vertical = st.dca_vertical.data();
  p.slash = st.dca_slash.data();
  p.keep_cols = st.dca_keep_cols.data();
  p.keep_dists = st.dca_keep_dists.data();
  ck::launch_dual_chunk_sparse_select(p, st.stream);
}

}  // namespace specula
