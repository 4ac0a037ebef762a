// What the speculative tests share: the shipped heads' folders, building draft candidates by
// hand, and one request's EXTEND forward outside the scheduler.
#pragma once

#include <filesystem>
#include <vector>

#include "specula/model/eagle_head.h"
#include "specula/runner/model_runner.h"
#include "specula/speculative/eagle_tree.h"

namespace specula::spec_fixtures {

inline const std::filesystem::path kRoot = SPECULA_SOURCE_DIR;

inline std::filesystem::path head_dir(EagleKind kind) {
  return kRoot / (kind == EagleKind::EAGLE ? "models/specula-byte-6m-eagle" : "models/specula-byte-6m-eagle3");
}

// Appends a candidate; its depth follows from its parent (-1: a child of the root).
inline void add_candidate(DraftCandidates& c, int32_t token, int32_t parent, float score) {
  c.tokens.push_back(token);
  c.parents.push_back(parent);
  c.scores.push_back(score);
  c.depths.push_back(parent < 0 ? 1 : c.depths[static_cast<size_t>(parent)] + 1);
}

// Runs ids at positions 0.. as one EXTEND request in request row `row`, whose KV slots are the
// first ids.size() of `slots`; returns the last token's logits.
inline std::vector<float> extend_forward(ModelRunner& runner, const std::vector<int32_t>& ids, int32_t row,
                                         const std::vector<int32_t>& slots, HiddenCapture* capture = nullptr) {
  const int n = static_cast<int>(ids.size());
  ForwardBatch b;
  b.forward_mode = ForwardMode::EXTEND;
  b.batch_size = 1;
  b.input_ids = ids;
  for (int i = 0; i < n; ++i) b.positions.push_back(i);
  b.out_cache_loc.assign(slots.begin(), slots.begin() + n);
  b.req_pool_indices = {row};
  b.seq_lens = {n};
  b.extend_prefix_lens = {0};
  b.extend_seq_lens = {n};
  std::vector<float> logits;
  runner.forward(b, logits, /*all_tokens=*/false, capture);
  return logits;
}

// The same in a fresh request row whose KV is freed again.
inline std::vector<float> last_token_logits(ModelRunner& runner, const std::vector<int32_t>& ids) {
  const int32_t row = runner.req_pool().alloc(1).value().at(0);
  const int32_t prefix[] = {0}, seq[] = {static_cast<int32_t>(ids.size())}, last[] = {-1};
  const auto slots = runner.allocator().alloc_extend(prefix, seq, last).value();
  runner.req_pool().write(row, 0, slots);
  std::vector<float> logits = extend_forward(runner, ids, row, slots);
  runner.allocator().free(slots);
  runner.req_pool().free(row);
  return logits;
}

}  // namespace specula::spec_fixtures
