// ForwardBatch helpers and validation.
#include "specula/batch/forward_batch.h"

#include "specula/core/error.h"
#include "specula/kv/req_to_token_pool.h"

namespace specula {

std::string_view forward_mode_name(ForwardMode mode) {
  switch (mode) {
    case ForwardMode::EXTEND: return "EXTEND";
    case ForwardMode::DECODE: return "DECODE";
    case ForwardMode::MIXED: return "MIXED";
    case ForwardMode::IDLE: return "IDLE";
    case ForwardMode::TARGET_VERIFY: return "TARGET_VERIFY";
    case ForwardMode::DRAFT_EXTEND: return "DRAFT_EXTEND";
  }
  return "?";
}

int32_t ForwardBatch::query_len(int i) const {
  switch (forward_mode) {
    case ForwardMode::DECODE: return 1;
    case ForwardMode::TARGET_VERIFY: return spec_info->num_draft_tokens;
    case ForwardMode::IDLE: return 0;
    default: return extend_seq_lens[static_cast<size_t>(i)];
  }
}

int32_t ForwardBatch::kv_len(int i) const {
  const int32_t s = seq_lens[static_cast<size_t>(i)];
  return forward_mode == ForwardMode::TARGET_VERIFY ? s + spec_info->num_draft_tokens : s;
}

void ForwardBatch::validate() const {
  const auto bs = static_cast<size_t>(batch_size);
  SPECULA_CHECK(batch_size >= 0, "batch_size {} is negative", batch_size);
  SPECULA_CHECK(req_pool_indices.size() == bs && seq_lens.size() == bs,
                "batch of {} requests has {} req_pool_indices and {} seq_lens", batch_size,
                req_pool_indices.size(), seq_lens.size());
  if (forward_mode == ForwardMode::TARGET_VERIFY) {
    SPECULA_CHECK(spec_info != nullptr && spec_info->num_draft_tokens >= 1,
                  "TARGET_VERIFY needs spec_info with num_draft_tokens >= 1");
  }
  const bool extend = forward_mode != ForwardMode::DECODE && forward_mode != ForwardMode::TARGET_VERIFY &&
                      forward_mode != ForwardMode::IDLE;
  if (extend) {
    SPECULA_CHECK(extend_prefix_lens.size() == bs && extend_seq_lens.size() == bs,
                  "{} batch of {} requests has {} extend_prefix_lens and {} extend_seq_lens",
                  forward_mode_name(forward_mode), batch_size, extend_prefix_lens.size(), extend_seq_lens.size());
  }
  int64_t tokens = 0;
  for (size_t i = 0; i < bs; ++i) {
    if (extend) {
      SPECULA_CHECK(extend_prefix_lens[i] >= 0 && extend_seq_lens[i] >= 0 &&
                        extend_prefix_lens[i] + extend_seq_lens[i] == seq_lens[i],
                    "request {}: extend_prefix_len {} + extend_seq_len {} != seq_len {}", i,
                    extend_prefix_lens[i], extend_seq_lens[i], seq_lens[i]);
    }
    SPECULA_CHECK(seq_lens[i] >= (forward_mode == ForwardMode::DECODE ? 1 : 0),
                  "request {}: seq_len {} is not valid for {}", i, seq_lens[i], forward_mode_name(forward_mode));
    tokens += query_len(static_cast<int>(i));
    if (req_to_token_pool != nullptr) {
      SPECULA_CHECK(req_pool_indices[i] >= 0 && req_pool_indices[i] < req_to_token_pool->size(),
                    "request {}: req_pool_index {} is out of range [0, {})", i, req_pool_indices[i],
                    req_to_token_pool->size());
      SPECULA_CHECK(kv_len(static_cast<int>(i)) <= req_to_token_pool->max_context_len(),
                    "request {}: KV length {} exceeds max_context_len {}", i, kv_len(static_cast<int>(i)),
                    req_to_token_pool->max_context_len());
    }
  }
  SPECULA_CHECK(static_cast<int64_t>(out_cache_loc.size()) == tokens,
                "{} batch has {} query tokens but {} out_cache_loc entries", forward_mode_name(forward_mode),
                tokens, out_cache_loc.size());
  SPECULA_CHECK(positions.empty() || static_cast<int64_t>(positions.size()) == tokens,
                "batch has {} query tokens but {} positions", tokens, positions.size());
  if (forward_mode == ForwardMode::TARGET_VERIFY && !spec_info->custom_mask.empty()) {
    int64_t mask_size = 0;
    for (size_t i = 0; i < bs; ++i) {
      mask_size += static_cast<int64_t>(spec_info->num_draft_tokens) * kv_len(static_cast<int>(i));
    }
    SPECULA_CHECK(static_cast<int64_t>(spec_info->custom_mask.size()) == mask_size,
                  "custom_mask has {} entries; the batch needs {} (sum of num_draft_tokens x "
                  "(seq_len + num_draft_tokens))", spec_info->custom_mask.size(), mask_size);
  }
}

ForwardBatch padding_decode_batch(int batch_size, int32_t req_row, int32_t slot) {
  ForwardBatch b;
  b.forward_mode = ForwardMode::DECODE;
  b.batch_size = batch_size;
  b.input_ids.assign(static_cast<size_t>(batch_size), 0);
  b.positions.assign(static_cast<size_t>(batch_size), 0);
  b.req_pool_indices.assign(static_cast<size_t>(batch_size), req_row);
  b.seq_lens.assign(static_cast<size_t>(batch_size), 1);
  b.out_cache_loc.assign(static_cast<size_t>(batch_size), slot);
  return b;
}

ForwardBatch pad_decode_batch(const ForwardBatch& batch, int batch_size, int32_t req_row, int32_t slot) {
  ForwardBatch padded = batch;
  const ForwardBatch pad = padding_decode_batch(batch_size - batch.batch_size, req_row, slot);
  auto append = [](std::vector<int32_t>& a, const std::vector<int32_t>& b) { a.insert(a.end(), b.begin(), b.end()); };
  append(padded.input_ids, pad.input_ids);
  append(padded.positions, pad.positions);
  append(padded.req_pool_indices, pad.req_pool_indices);
  append(padded.seq_lens, pad.seq_lens);
  append(padded.out_cache_loc, pad.out_cache_loc);
  padded.batch_size = batch_size;
  return padded;
}

}  // namespace specula
