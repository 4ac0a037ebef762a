#include "specula/attention/cpu/dual_chunk_parts.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "specula/attention/cpu/dual_chunk.h"
#include "specula/core/thread_pool.h"

namespace specula {

bool dual_chunk_parts_fit(const CpuAttentionParams& p, const DualChunkShape& shape) {
  return shape.chunk_len % p.page_size == 0 && p.window_left < 0 && p.custom_mask == nullptr && p.sinks == nullptr;
}

bool DualChunkPassPlan::built_for(const DualChunkShape& shape) const {
  return chunk_len == shape.chunk_len && original_max_position == shape.original_max_position &&
         sparse_threshold == (shape.sparse != nullptr && shape.sparse_rows ? shape.sparse->threshold : -1);
}

DualChunkPassPlan plan_dual_chunk_parts(int page_size, int num_q_heads, int num_kv_heads, const DualChunkShape& shape,
                                        std::span<const CpuAttentionSeq> seqs) {
  DualChunkPassPlan plan;
  const int cl = shape.chunk_len;
  plan.chunk_len = cl;
  plan.original_max_position = shape.original_max_position;
  plan.sparse_threshold = shape.sparse != nullptr && shape.sparse_rows ? shape.sparse->threshold : -1;
  for (const CpuAttentionSeq& s : seqs) {
    plan.num_rows = std::max<int64_t>(plan.num_rows, s.q_start + s.q_len);
    for (int64_t t = s.q_start; t < s.q_start + s.q_len; ++t) plan.all_rows.push_back(t);
  }
  for (int part = 0; part < 3; ++part) {
    std::vector<CpuAttentionSeq>& virt = plan.virt[static_cast<size_t>(part)];
    for (const CpuAttentionSeq& seq : seqs) {
      const int first = seq.q_kv_offset, last = seq.q_kv_offset + seq.q_len - 1;
      const auto f = static_cast<float>(dual_chunk_logit_scale(seq.kv_len, shape.original_max_position));
      for (int c = std::max(first / cl, part); c <= last / cl; ++c) {
        const int begin = std::max(first, c * cl), end = std::min(last + 1, (c + 1) * cl);
        const int key_begin = part == 0 ? c * cl : part == 1 ? (c - 1) * cl : 0;
        const int key_end = part == 0 ? end : part == 1 ? c * cl : (c - 1) * cl;
        CpuAttentionSeq v{};
        v.q_start = seq.q_start + (begin - seq.q_kv_offset);
        v.q_len = end - begin;
        v.kv_len = key_end - key_begin;
        // Intra: the query at KV index begin - key_begin of its slice; the others see every key.
        v.q_kv_offset = part == 0 ? begin - key_begin : v.kv_len;
        v.pages = seq.pages + key_begin / page_size;
        virt.push_back(v);
        for (int64_t t = v.q_start; t < v.q_start + v.q_len; ++t) plan.rows[static_cast<size_t>(part)].emplace_back(t, f);
      }
    }
    plan.plans[static_cast<size_t>(part)] = plan_cpu_attention(virt, num_q_heads, num_kv_heads);
  }
  return plan;
}

void run_dual_chunk_parts(CpuIsa isa, const CpuAttentionParams& p, const DualChunkPassPlan& plan,
                          std::vector<CpuAttentionScratch>& scratch, ThreadPool& pool) {
  const int D = p.head_dim, Dv = p.v_head_dim, Hq = p.num_q_heads;
  const int64_t n = plan.num_rows;
  const int64_t q_elem = static_cast<int64_t>(dtype_size(p.q_dtype));

  // One pass's variant of the queries it reaches (times their sequence's temperature), its rows
  // and log-sum-exps, and the passes merged so far. Kept per calling thread from call to call and
  // only grown (every layer of a step asks for the same sizes): each pass writes every row it
  // reads, and the intra pass, which reaches every row, is copied rather than merged.
  struct Buffers {
    std::vector<float> q, part_out, part_lse, out, lse;
  };
  thread_local Buffers held;
  auto grow = [](std::vector<float>& v, int64_t size) {
    if (v.size() < static_cast<size_t>(size)) v.resize(static_cast<size_t>(size));
    return v.data();
  };
  float* const q = grow(held.q, n * Hq * D);
  float* const part_out = grow(held.part_out, n * Hq * Dv);
  float* const part_lse = grow(held.part_lse, n * Hq);
  float* const out = grow(held.out, n * Hq * Dv);
  float* const lse = grow(held.lse, n * Hq);
  for (int part = 0; part < 3; ++part) {
    const std::vector<CpuAttentionSeq>& virt = plan.virt[static_cast<size_t>(part)];
    const std::vector<std::pair<int64_t, float>>& rows = plan.rows[static_cast<size_t>(part)];
    if (virt.empty()) continue;
    pool.parallel_for(static_cast<int64_t>(rows.size()), [&](int64_t i, int) {
      const auto [t, f] = rows[static_cast<size_t>(i)];
      for (int h = 0; h < Hq; ++h) {
        float* dst = q + (t * Hq + h) * D;
        convert_to_float(static_cast<const char*>(p.q) + (t * p.q_stride_token + h * p.q_stride_head + part * D) * q_elem,
                         p.q_dtype, dst, static_cast<size_t>(D));
        if (f != 1.0f) {
          for (int d = 0; d < D; ++d) dst[d] *= f;
        }
      }
    });
    CpuAttentionParams pp = p;
    pp.q = q;
    pp.q_dtype = DType::f32;
    pp.q_stride_token = static_cast<int64_t>(Hq) * D;
    pp.q_stride_head = D;
    pp.out = part == 0 ? out : part_out;
    pp.out_dtype = DType::f32;
    pp.out_stride_token = static_cast<int64_t>(Hq) * Dv;
    pp.out_stride_head = Dv;
    pp.lse = part == 0 ? lse : part_lse;
    pp.lse_stride_token = Hq;
    pp.causal = part == 0;
    run_cpu_attention(isa, pp, virt, plan.plans[static_cast<size_t>(part)], scratch, pool);
    if (part == 0) continue;  // the intra pass wrote the running result itself
    // Merge this pass into the running result, row by row.
    pool.parallel_for(static_cast<int64_t>(rows.size()), [&](int64_t i, int) {
      const int64_t t = rows[static_cast<size_t>(i)].first;
      for (int64_t at = t * Hq; at < (t + 1) * Hq; ++at) {
        const float a = lse[at], b = part_lse[at];
        float* o = out + at * Dv;
        const float* ob = part_out + at * Dv;
        if (b == -INFINITY) continue;
        if (a == -INFINITY) {
          std::copy_n(ob, Dv, o);
          lse[at] = b;
          continue;
        }
        const float m = std::max(a, b), wa = std::exp(a - m), wb = std::exp(b - m), total = wa + wb;
        for (int d = 0; d < Dv; ++d) o[d] = (wa * o[d] + wb * ob[d]) / total;
        lse[at] = m + std::log(total);
      }
    });
  }

  const int64_t out_elem = static_cast<int64_t>(dtype_size(p.out_dtype));
  pool.parallel_for(static_cast<int64_t>(plan.all_rows.size()), [&](int64_t i, int) {
    const int64_t t = plan.all_rows[static_cast<size_t>(i)];
    for (int h = 0; h < Hq; ++h) {
      const int64_t at = t * Hq + h;
      convert_from_float(out + at * Dv, static_cast<char*>(p.out) + (t * p.out_stride_token + h * p.out_stride_head) * out_elem,
                         p.out_dtype, static_cast<size_t>(Dv));
      if (p.lse != nullptr) p.lse[t * p.lse_stride_token + h] = lse[at];
    }
  });
}

}  // namespace specula
