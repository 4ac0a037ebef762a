#include "specula/attention/cpu/dual_chunk_sparse.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "specula/attention/cpu/dual_chunk.h"

namespace specula {

std::vector<bool> top_scores(const std::vector<double>& scores, int keep) {
  std::vector<int32_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  const auto n = std::min(static_cast<size_t>(std::max(keep, 0)), order.size());
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n), order.end(),
                    [&](int32_t a, int32_t b) {
                      const double sa = scores[static_cast<size_t>(a)], sb = scores[static_cast<size_t>(b)];
                      return sa != sb ? sa > sb : a < b;
                    });
  std::vector<bool> kept(scores.size(), false);
  for (size_t i = 0; i < n; ++i) kept[static_cast<size_t>(order[i])] = true;
  return kept;
}

VerticalSlashKeep select_vertical_slash(const CpuAttentionParams& p, const DualChunkShape& shape,
                                        const DualChunkSparsePattern& pattern, const CpuAttentionSeq& seq, int begin,
                                        int end, int head, double logit_scale) {
  const int D = p.head_dim, kh = head / (p.num_q_heads / p.num_kv_heads);
  const int64_t q_elem = static_cast<int64_t>(dtype_size(p.q_dtype));
  const int64_t kv_elem = static_cast<int64_t>(dtype_size(p.kv_dtype));
  const int chunk = begin / shape.chunk_len;
  const double scale = p.scale * logit_scale * p.k_descale;
  std::vector<double> vertical(static_cast<size_t>(end), 0.0), slash(static_cast<size_t>(end), 0.0);
  std::vector<float> q(static_cast<size_t>(5 * D)), k(static_cast<size_t>(D));
  std::vector<double> scores;
  auto logit = [&](int j) {
    const int64_t slot = static_cast<int64_t>(seq.pages[j / p.page_size]) * p.page_size + j % p.page_size;
    convert_to_float(static_cast<const char*>(p.k_cache) + ((slot * p.num_kv_heads + kh) * D) * kv_elem, p.kv_dtype,
                     k.data(), k.size());
    const int key_chunk = j / shape.chunk_len;
    // Own chunk: intra (0); the chunk before: successive, unclamped (3); earlier: inter, unclamped (4).
    const float* qv = q.data() + (key_chunk == chunk ? 0 : key_chunk == chunk - 1 ? 3 : 4) * D;
    double dot = 0.0;
    for (int d = 0; d < D; ++d) dot += static_cast<double>(qv[d]) * k[static_cast<size_t>(d)];
    double s = dot * scale;
    if (p.logit_cap > 0.0f) s = p.logit_cap * std::tanh(s / p.logit_cap);
    return s;
  };
  const int estimators = std::min(end - begin, pattern.last_q);
  for (int pos = end - estimators; pos < end; ++pos) {
    const int64_t token = seq.q_start + (pos - seq.q_kv_offset);
    convert_to_float(static_cast<const char*>(p.q) + (token * p.q_stride_token + head * p.q_stride_head) * q_elem,
                     p.q_dtype, q.data(), q.size());
    scores.resize(static_cast<size_t>(pos + 1));
    for (int j = 0; j <= pos; ++j) scores[static_cast<size_t>(j)] = logit(j);
    const double top = *std::max_element(scores.begin(), scores.end());
    double denom = 0.0;
    for (double& s : scores) denom += s = std::exp(s - top);
    for (int j = 0; j <= pos; ++j) {
      const double prob = scores[static_cast<size_t>(j)] / denom;
      vertical[static_cast<size_t>(j)] += prob;
      slash[static_cast<size_t>(pos - j)] += prob;
    }
  }
  std::fill_n(vertical.begin(), std::min(pattern.forced_vertical, end), INFINITY);
  std::fill_n(slash.begin(), std::min(pattern.forced_slash, end), INFINITY);
  return VerticalSlashKeep{top_scores(vertical, pattern.vertical[static_cast<size_t>(head)]),
                           top_scores(slash, pattern.slash[static_cast<size_t>(head)])};
}

}  // namespace specula
