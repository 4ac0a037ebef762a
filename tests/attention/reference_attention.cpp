// The naive reference (see the header).
#include "attention/reference_attention.h"

#include <cmath>
#include <limits>

#include "specula/core/dtype.h"

namespace specula::testing {

std::vector<uint8_t> reference_mask(const MaskRules& rules, int q_len, int kv_len, int q_kv_offset,
                                    const std::vector<uint8_t>& custom) {
  std::vector<uint8_t> mask(static_cast<size_t>(q_len) * static_cast<size_t>(kv_len));
  for (int i = 0; i < q_len; ++i) {
    const int pos = q_kv_offset + i;
    for (int j = 0; j < kv_len; ++j) {
      bool visible = true;
      if (rules.causal && j > pos) visible = false;
      if (rules.window_left >= 0 && j < pos - rules.window_left) visible = false;
      if (rules.chunk_size > 0 && j / rules.chunk_size != pos / rules.chunk_size) visible = false;
      const size_t idx = static_cast<size_t>(i) * static_cast<size_t>(kv_len) + static_cast<size_t>(j);
      if (!custom.empty() && custom[idx] == 0) visible = false;
      mask[idx] = visible ? 1 : 0;
    }
  }
  return mask;
}

template <typename T>
void reference_attention(const ReferenceLayer& layer, const std::vector<double>& q, const std::vector<double>& k,
                         const std::vector<double>& v, const std::vector<uint8_t>& mask, int q_len, int kv_len,
                         std::vector<double>& out, std::vector<double>& lse, bool round_probs) {
  const int H = layer.num_q_heads, Hk = layer.num_kv_heads, D = layer.head_dim, Dv = layer.v_head_dim;
  const int group = H / Hk;
  out.assign(static_cast<size_t>(q_len) * H * Dv, 0.0);
  lse.assign(static_cast<size_t>(q_len) * H, -std::numeric_limits<double>::infinity());
  std::vector<T> scores(static_cast<size_t>(kv_len));
  for (int i = 0; i < q_len; ++i) {
    for (int h = 0; h < H; ++h) {
      const int kh = h / group;
      T max_score = -std::numeric_limits<T>::infinity();
      for (int j = 0; j < kv_len; ++j) {
        if (!mask[static_cast<size_t>(i) * kv_len + j]) continue;
        T dot = 0;
        for (int d = 0; d < D; ++d) {
          dot += static_cast<T>(q[(static_cast<size_t>(i) * H + h) * D + d]) *
                 static_cast<T>(k[(static_cast<size_t>(j) * Hk + kh) * D + d]);
        }
        T s = dot * static_cast<T>(layer.scale);
        if (layer.logit_cap > 0) s = static_cast<T>(layer.logit_cap) * std::tanh(s / static_cast<T>(layer.logit_cap));
        scores[static_cast<size_t>(j)] = s;
        max_score = std::max(max_score, s);
      }
      T sink = -std::numeric_limits<T>::infinity();
      if (!layer.sinks.empty()) sink = static_cast<T>(layer.sinks[static_cast<size_t>(h)]);
      const T m = std::max(max_score, sink);
      if (m == -std::numeric_limits<T>::infinity()) continue;  // sees nothing: out 0, lse -inf
      T denom = layer.sinks.empty() ? T(0) : std::exp(sink - m);
      std::vector<T> acc(static_cast<size_t>(Dv), T(0));
      for (int j = 0; j < kv_len; ++j) {
        if (!mask[static_cast<size_t>(i) * kv_len + j]) continue;
        const T p_exact = std::exp(scores[static_cast<size_t>(j)] - m);
        denom += p_exact;
        const T p = round_probs ? static_cast<T>(bf16_bits_to_float(float_to_bf16_bits(static_cast<float>(p_exact)))) : p_exact;
        for (int d = 0; d < Dv; ++d) acc[static_cast<size_t>(d)] += p * static_cast<T>(v[(static_cast<size_t>(j) * Hk + kh) * Dv + d]);
      }
      for (int d = 0; d < Dv; ++d) {
        out[(static_cast<size_t>(i) * H + h) * Dv + d] = static_cast<double>(acc[static_cast<size_t>(d)] / denom);
      }
      lse[static_cast<size_t>(i) * H + h] = static_cast<double>(m + std::log(denom));
    }
  }
}

template void reference_attention<double>(const ReferenceLayer&, const std::vector<double>&, const std::vector<double>&,
                                          const std::vector<double>&, const std::vector<uint8_t>&, int, int,
                                          std::vector<double>&, std::vector<double>&, bool);
template void reference_attention<float>(const ReferenceLayer&, const std::vector<double>&, const std::vector<double>&,
                                         const std::vector<double>&, const std::vector<uint8_t>&, int, int,
                                         std::vector<double>&, std::vector<double>&, bool);

}  // namespace specula::testing
