// Splitting long decode rows over their keys, and merging the chunks (decode_split.h).
#include "specula/attention/cpu/decode_split.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>

#include "specula/core/dtype.h"
#include "specula/core/thread_pool.h"

namespace specula {

namespace {

// The keys the item's query token sees: [begin, end).
std::pair<int32_t, int32_t> visible_keys(const CpuAttentionParams& p, const CpuAttentionSeq& seq, const CpuWorkItem& it) {
  const int32_t pos = seq.q_kv_offset + it.q_begin;
  const int32_t end = p.causal ? std::min(seq.kv_len, pos + 1) : seq.kv_len;
  const int32_t begin = p.window_left >= 0 ? std::max(0, pos - p.window_left) : 0;
  return {begin, std::max(begin, end)};
}

}  // namespace

DecodeSplit split_decode_items(const CpuAttentionParams& p, std::span<const CpuAttentionSeq> seqs,
                               std::span<const CpuWorkItem> items) {
  DecodeSplit out;
  std::vector<CpuWorkItem> long_rest, short_rest;
  // Items to split, grouped by their token in first-appearance order (the index of each
  // (sequence, token) in `tokens`, so that a batch of many long rows groups in linear time).
  std::vector<std::vector<size_t>> tokens;
  std::unordered_map<int64_t, size_t> token_index;
  for (size_t i = 0; i < items.size(); ++i) {
    const CpuWorkItem& it = items[i];
    const auto [begin, end] = visible_keys(p, seqs[static_cast<size_t>(it.seq)], it);
    if (it.q_count == 1 && end - begin > kDecodeSplitMinKeys) {
      const int64_t key = (static_cast<int64_t>(it.seq) << 32) | static_cast<uint32_t>(it.q_begin);
      const auto [found, added] = token_index.try_emplace(key, tokens.size());
      if (added) {
        tokens.push_back({i});
      } else {
        tokens[found->second].push_back(i);
      }
    } else if (end - begin > kDecodeSplitKeys) {
      long_rest.push_back(it);
    } else {
      short_rest.push_back(it);
    }
  }
  out.items = std::move(long_rest);
  for (const std::vector<size_t>& token : tokens) {
    const CpuWorkItem& head = items[token[0]];
    const auto [begin, end] = visible_keys(p, seqs[static_cast<size_t>(head.seq)], head);
    const int32_t c0 = begin / kDecodeSplitKeys, c1 = (end + kDecodeSplitKeys - 1) / kDecodeSplitKeys;
    std::vector<int64_t> first(token.size());
    for (size_t k = 0; k < token.size(); ++k) {
      const CpuWorkItem& it = items[token[k]];
      first[k] = out.partial_floats;
      out.merges.push_back({it, out.partial_floats, c1 - c0});
      out.partial_floats += static_cast<int64_t>(c1 - c0) * it.num_heads * (p.v_head_dim + 1);
    }
    for (int32_t c = c0; c < c1; ++c) {
      for (size_t k = 0; k < token.size(); ++k) {
        CpuWorkItem chunk = items[token[k]];
        chunk.key_begin = c * kDecodeSplitKeys;
        chunk.key_end = (c + 1) * kDecodeSplitKeys;
        chunk.partial = first[k] + static_cast<int64_t>(c - c0) * chunk.num_heads * (p.v_head_dim + 1);
        out.items.push_back(chunk);
      }
    }
  }
  out.items.insert(out.items.end(), short_rest.begin(), short_rest.end());
  return out;
}

void merge_decode_chunks(const CpuAttentionParams& p, std::span<const CpuAttentionSeq> seqs, const DecodeSplit& split,
                         const float* partials, ThreadPool& pool) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const int Dv = p.v_head_dim;
  const int group = p.num_q_heads / p.num_kv_heads;
  pool.parallel_for(static_cast<int64_t>(split.merges.size()), [&](int64_t i, int) {
    const DecodeSplit::Merge& mg = split.merges[static_cast<size_t>(i)];
    const CpuWorkItem& it = mg.item;
    const int G = it.num_heads;
    const int64_t slot = static_cast<int64_t>(G) * (Dv + 1);
    const int token = seqs[static_cast<size_t>(it.seq)].q_start + it.q_begin;
    for (int g = 0; g < G; ++g) {
      const int head = it.kv_head * group + it.head_begin + g;
      auto lse = [&](int c) { return partials[mg.first + c * slot + static_cast<int64_t>(G) * Dv + g]; };
      float top = p.sinks != nullptr ? p.sinks[head] : kNegInf;
      for (int c = 0; c < mg.chunks; ++c) top = std::max(top, lse(c));
      const size_t base = static_cast<size_t>(token * p.out_stride_token + head * p.out_stride_head);
      if (top == kNegInf) {
        // No visible key and no sink: zeros, as the unsplit kernel writes.
        for (int d = 0; d < Dv; ++d) store_from_float(p.out, p.out_dtype, base + static_cast<size_t>(d), 0.0f);
        if (p.lse != nullptr) p.lse[token * p.lse_stride_token + head] = kNegInf;
        continue;
      }
      float denominator = p.sinks != nullptr ? std::exp(p.sinks[head] - top) : 0.0f;
      for (int c = 0; c < mg.chunks; ++c) denominator += lse(c) == kNegInf ? 0.0f : std::exp(lse(c) - top);
      for (int d = 0; d < Dv; ++d) {
        float sum = 0.0f;
        for (int c = 0; c < mg.chunks; ++c) {
          if (lse(c) != kNegInf) sum += std::exp(lse(c) - top) * partials[mg.first + c * slot + g * Dv + d];
        }
        store_from_float(p.out, p.out_dtype, base + static_cast<size_t>(d), sum / denominator);
      }
      if (p.lse != nullptr) p.lse[token * p.lse_stride_token + head] = top + std::log(denominator);
    }
  });
}

}  // namespace specula
