#include "specula/attention/cpu/dual_chunk.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "specula/attention/cpu/dual_chunk_sparse.h"
#include "specula/core/thread_pool.h"

namespace specula {

double dual_chunk_logit_scale(int kv_len, int original_max_position) {
  if (original_max_position <= 0 || kv_len <= 0) return 1.0;
  return std::max(1.0, 0.1 * std::log(static_cast<double>(kv_len) / original_max_position) + 1.0);
}

void run_dual_chunk_attention(CpuIsa isa, const CpuAttentionParams& p, const DualChunkShape& shape,
                              std::span<const CpuAttentionSeq> seqs, std::optional<DualChunkPassPlan>& parts_plan,
                              std::vector<CpuAttentionScratch>& scratch, ThreadPool& pool) {
  const int D = p.head_dim, Dv = p.v_head_dim, Hq = p.num_q_heads, Hkv = p.num_kv_heads;
  const int group = Hq / Hkv;
  const int64_t q_elem = static_cast<int64_t>(dtype_size(p.q_dtype));
  const int64_t kv_elem = static_cast<int64_t>(dtype_size(p.kv_dtype));
  const int64_t out_elem = static_cast<int64_t>(dtype_size(p.out_dtype));
  // Sparse runs (one per sequence and chunk its new tokens reach), each head's kept keys picked
  // before any row attends; run_base[s] is sequence s's first run, or -1 when it attends densely.
  std::vector<int32_t> run_base(seqs.size(), -1), run_seq, run_begin, run_end;
  if (shape.sparse != nullptr && shape.sparse_rows) {
    for (size_t s = 0; s < seqs.size(); ++s) {
      const CpuAttentionSeq& seq = seqs[s];
      if (seq.q_len < 2 || seq.kv_len <= shape.sparse->threshold) continue;
      run_base[s] = static_cast<int32_t>(run_seq.size());
      const int first = seq.q_kv_offset, last = seq.q_kv_offset + seq.q_len - 1;
      for (int c = first / shape.chunk_len; c <= last / shape.chunk_len; ++c) {
        run_seq.push_back(static_cast<int32_t>(s));
        run_begin.push_back(std::max(first, c * shape.chunk_len));
        run_end.push_back(std::min(last + 1, (c + 1) * shape.chunk_len));
      }
    }
  }
  // Dense sequences through the kernels where they fit; the loop below takes the rest.
  const bool kernels = dual_chunk_parts_fit(p, shape);
  if (kernels) {
    if (!parts_plan || !parts_plan->built_for(shape)) {
      std::vector<CpuAttentionSeq> dense;
      for (size_t s = 0; s < seqs.size(); ++s) {
        if (run_base[s] < 0) dense.push_back(seqs[s]);
      }
      parts_plan = plan_dual_chunk_parts(p.page_size, Hq, Hkv, shape, dense);
    }
    if (!parts_plan->all_rows.empty()) run_dual_chunk_parts(isa, p, *parts_plan, scratch, pool);
    if (run_seq.empty()) return;
  }
  // The loop's work items (query row, query head), rows numbered across its sequences.
  std::vector<int32_t> row_seq, row_index;
  for (size_t s = 0; s < seqs.size(); ++s) {
    if (kernels && run_base[s] < 0) continue;
    for (int32_t i = 0; i < seqs[s].q_len; ++i) {
      row_seq.push_back(static_cast<int32_t>(s));
      row_index.push_back(i);
    }
  }
  const auto rows = static_cast<int64_t>(row_seq.size());
  std::vector<VerticalSlashKeep> keeps(run_seq.size() * static_cast<size_t>(Hq));
  pool.parallel_for(static_cast<int64_t>(keeps.size()), [&](int64_t item, int) {
    const auto r = static_cast<size_t>(item / Hq);
    const CpuAttentionSeq& seq = seqs[static_cast<size_t>(run_seq[r])];
    keeps[static_cast<size_t>(item)] =
        select_vertical_slash(p, shape, *shape.sparse, seq, run_begin[r], run_end[r], static_cast<int>(item % Hq),
                              dual_chunk_logit_scale(seq.kv_len, shape.original_max_position));
  });
  // Per-thread rows: the query's variants, a K row, a V row (converted to f32), the accumulator.
  struct RowScratch {
    std::vector<float> q, k, v, o;
    std::vector<double> acc;
  };
  std::vector<RowScratch> row_scratch(static_cast<size_t>(pool.num_threads()));
  for (RowScratch& s : row_scratch) {
    s.q.resize(static_cast<size_t>(3 * D));
    s.k.resize(static_cast<size_t>(D));
    s.v.resize(static_cast<size_t>(Dv));
    s.o.resize(static_cast<size_t>(Dv));
    s.acc.resize(static_cast<size_t>(Dv));
  }
  pool.parallel_for(rows * Hq, [&](int64_t item, int thread) {
    RowScratch& sc = row_scratch[static_cast<size_t>(thread)];
    std::vector<float>& q = sc.q;
    std::vector<float>& k = sc.k;
    std::vector<float>& v = sc.v;
    std::vector<float>& o = sc.o;
    std::vector<double>& acc = sc.acc;
    const auto r = static_cast<size_t>(item / Hq);
    const int h = static_cast<int>(item % Hq), kh = h / group;
    const CpuAttentionSeq& seq = seqs[static_cast<size_t>(row_seq[r])];
    const int i = row_index[r];
    const int64_t token = seq.q_start + i;
    const int pos = seq.q_kv_offset + i;
    const int chunk = pos / shape.chunk_len;
    const double scale = p.scale * dual_chunk_logit_scale(seq.kv_len, shape.original_max_position);
    const int32_t base = run_base[static_cast<size_t>(row_seq[r])];
    const VerticalSlashKeep* keep =
        base < 0 ? nullptr
                 : &keeps[static_cast<size_t>(base + chunk - seq.q_kv_offset / shape.chunk_len) * static_cast<size_t>(Hq) +
                          static_cast<size_t>(h)];

    // The query's three attending variants, in f32.
    const char* q_row = static_cast<const char*>(p.q) + (token * p.q_stride_token + h * p.q_stride_head) * q_elem;
    convert_to_float(q_row, p.q_dtype, q.data(), q.size());
    const int last = p.causal ? std::min(pos, seq.kv_len - 1) : seq.kv_len - 1;
    double top = -INFINITY, denom = 0.0;
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int j = 0; j <= last; ++j) {
      if (keep != nullptr && !keep->keeps(pos, j)) continue;
      const int64_t slot = static_cast<int64_t>(seq.pages[j / p.page_size]) * p.page_size + j % p.page_size;
      convert_to_float(static_cast<const char*>(p.k_cache) + ((slot * Hkv + kh) * D) * kv_elem, p.kv_dtype, k.data(),
                       k.size());
      const int key_chunk = j / shape.chunk_len;
      const int variant = key_chunk == chunk ? 0 : key_chunk == chunk - 1 ? 1 : 2;
      const float* qv = q.data() + variant * D;
      double dot = 0.0;
      for (int d = 0; d < D; ++d) dot += static_cast<double>(qv[d]) * k[static_cast<size_t>(d)];
      double s = dot * p.k_descale * scale;
      if (p.logit_cap > 0.0f) s = p.logit_cap * std::tanh(s / p.logit_cap);
      const double top_new = std::max(top, s);
      const double corr = std::exp(top - top_new), w = std::exp(s - top_new);
      convert_to_float(static_cast<const char*>(p.v_cache) + ((slot * Hkv + kh) * Dv) * kv_elem, p.kv_dtype, v.data(),
                       v.size());
      for (int d = 0; d < Dv; ++d) acc[static_cast<size_t>(d)] = acc[static_cast<size_t>(d)] * corr + w * v[static_cast<size_t>(d)] * p.v_descale;
      denom = denom * corr + w;
      top = top_new;
    }
    for (int d = 0; d < Dv; ++d) o[static_cast<size_t>(d)] = static_cast<float>(acc[static_cast<size_t>(d)] / denom);
    convert_from_float(o.data(), static_cast<char*>(p.out) + (token * p.out_stride_token + h * p.out_stride_head) * out_elem,
                       p.out_dtype, o.size());
    if (p.lse != nullptr) p.lse[token * p.lse_stride_token + h] = static_cast<float>(top + std::log(denom));
  });
}

}  // namespace specula
