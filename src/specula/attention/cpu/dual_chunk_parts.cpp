#include "specula/attention/cpu/dual_chunk_parts.h"

#include <algorithm>
#include <cmath>

#include "specula/attention/cpu/dual_chunk.h"
#include "specula/core/thread_pool.h"

namespace specula {

bool dual_chunk_parts_fit(const CpuAttentionParams& p, const DualChunkShape& shape) {
  return shape.chunk_len % p.page_size == 0 && p.window_left < 0 && p.custom_mask == nullptr && p.sinks == nullptr;
}

void run_dual_chunk_parts(CpuIsa isa, const CpuAttentionParams& p, const DualChunkShape& shape,
                          std::span<const CpuAttentionSeq> seqs, std::vector<CpuAttentionScratch>& scratch,
                          ThreadPool& pool) {
  const int D = p.head_dim, Dv = p.v_head_dim, Hq = p.num_q_heads, cl = shape.chunk_len;
  int64_t n = 0;
  for (const CpuAttentionSeq& s : seqs) n = std::max<int64_t>(n, s.q_start + s.q_len);
  const int64_t q_elem = static_cast<int64_t>(dtype_size(p.q_dtype));
  const auto width = static_cast<int64_t>(3 * D);

  // The three variants of every query, in f32, times the temperature of its sequence's length.
  std::vector<float> q(static_cast<size_t>(n * Hq * width));
  pool.parallel_for(static_cast<int64_t>(seqs.size()), [&](int64_t s, int) {
    const CpuAttentionSeq& seq = seqs[static_cast<size_t>(s)];
    const auto f = static_cast<float>(dual_chunk_logit_scale(seq.kv_len, shape.original_max_position));
    for (int64_t t = seq.q_start; t < seq.q_start + seq.q_len; ++t) {
      for (int h = 0; h < Hq; ++h) {
        float* dst = q.data() + (t * Hq + h) * width;
        convert_to_float(static_cast<const char*>(p.q) + (t * p.q_stride_token + h * p.q_stride_head) * q_elem,
                         p.q_dtype, dst, static_cast<size_t>(width));
        if (f != 1.0f) {
          for (int64_t i = 0; i < width; ++i) dst[i] *= f;
        }
      }
    }
  });

  // Each pass's rows and log-sum-exps; a row a pass does not reach keeps -inf.
  std::vector<float> part_out[3], part_lse[3];
  for (int part = 0; part < 3; ++part) {
    std::vector<CpuAttentionSeq> virt;
    for (const CpuAttentionSeq& seq : seqs) {
      const int first = seq.q_kv_offset, last = seq.q_kv_offset + seq.q_len - 1;
      for (int c = first / cl; c <= last / cl; ++c) {
        if (c < part) continue;  // no chunk before (successive) or none two before (inter)
        const int begin = std::max(first, c * cl), end = std::min(last + 1, (c + 1) * cl);
        const int key_begin = part == 0 ? c * cl : part == 1 ? (c - 1) * cl : 0;
        const int key_end = part == 0 ? end : part == 1 ? c * cl : (c - 1) * cl;
        CpuAttentionSeq v{};
        v.q_start = seq.q_start + (begin - seq.q_kv_offset);
        v.q_len = end - begin;
        v.kv_len = key_end - key_begin;
        // Intra: the query at KV index begin - key_begin of its slice; the others see every key.
        v.q_kv_offset = part == 0 ? begin - key_begin : v.kv_len;
        v.pages = seq.pages + key_begin / p.page_size;
        virt.push_back(v);
      }
    }
    part_lse[part].assign(static_cast<size_t>(n * Hq), -INFINITY);
    if (virt.empty()) continue;
    part_out[part].assign(static_cast<size_t>(n * Hq * Dv), 0.0f);
    CpuAttentionParams pp = p;
    pp.q = q.data() + part * D;
    pp.q_dtype = DType::f32;
    pp.q_stride_token = Hq * width;
    pp.q_stride_head = width;
    pp.out = part_out[part].data();
    pp.out_dtype = DType::f32;
    pp.out_stride_token = static_cast<int64_t>(Hq) * Dv;
    pp.out_stride_head = Dv;
    pp.lse = part_lse[part].data();
    pp.lse_stride_token = Hq;
    pp.causal = part == 0;
    const CpuAttentionPlan plan = plan_cpu_attention(virt, Hq, p.num_kv_heads);
    run_cpu_attention(isa, pp, virt, plan, scratch, pool);
  }

  // Merge the passes by their log-sum-exps into the caller's output.
  const int64_t out_elem = static_cast<int64_t>(dtype_size(p.out_dtype));
  pool.parallel_for(static_cast<int64_t>(seqs.size()), [&](int64_t s, int) {
    const CpuAttentionSeq& seq = seqs[static_cast<size_t>(s)];
    std::vector<float> o(static_cast<size_t>(Dv));
    for (int64_t t = seq.q_start; t < seq.q_start + seq.q_len; ++t) {
      for (int h = 0; h < Hq; ++h) {
        const size_t at = static_cast<size_t>(t * Hq + h);
        float top = -INFINITY;
        for (const auto& lse : part_lse) top = std::max(top, lse[at]);
        float w[3] = {0.0f, 0.0f, 0.0f}, total = 0.0f;
        for (int part = 0; part < 3; ++part) {
          if (part_lse[part][at] > -INFINITY) total += w[part] = std::exp(part_lse[part][at] - top);
        }
        std::fill(o.begin(), o.end(), 0.0f);
        for (int part = 0; part < 3; ++part) {
          if (w[part] == 0.0f) continue;
          const float* src = part_out[part].data() + at * static_cast<size_t>(Dv);
          const float a = w[part] / total;
          for (int d = 0; d < Dv; ++d) o[static_cast<size_t>(d)] += a * src[d];
        }
        convert_from_float(o.data(), static_cast<char*>(p.out) + (t * p.out_stride_token + h * p.out_stride_head) * out_elem,
                           p.out_dtype, o.size());
        if (p.lse != nullptr) p.lse[t * p.lse_stride_token + h] = top + std::log(total);
      }
    }
  });
}

}  // namespace specula
