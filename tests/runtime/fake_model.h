// FakeModel: a Model with no weights for scheduler tests that run in milliseconds. It attends
// to nothing, yet its output still depends on the KV cache exactly as a real model's does: each
// step writes every new token (and its position) into its KV slot, and a row's greedy token is a
// hash of the tokens read back through the request table for positions [0, p] of that row's
// position p. A slot mapped wrongly (a bad prefix-cache page, a retraction that lost KV) so changes
// the output, and a slot holding another position fails the step. Every forward's batch is
// recorded, so tests can assert what the scheduler ran. TARGET_VERIFY steps read each tree row's
// context under the tree mask (the prefix, then the tree tokens the row sees), and a capture
// gets, per token and captured layer, [token id, position, 0, ...]: what a draft head may read.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "specula/core/error.h"
#include "specula/kv/mha_kv_pool.h"
#include "specula/kv/req_to_token_pool.h"
#include "specula/model/model.h"

namespace specula::testing_fixtures {

// What one forward ran.
struct RecordedBatch {
  ForwardMode mode = ForwardMode::IDLE;
  int batch_size = 0;
  std::vector<int32_t> input_ids;
  std::vector<int32_t> positions;
  std::vector<int32_t> seq_lens;
  std::vector<int32_t> extend_prefix_lens;  // empty for DECODE
  std::vector<int32_t> extend_seq_lens;     // empty for DECODE
  std::vector<int32_t> out_cache_loc;
};

class FakeModel : public Model {
 public:
  static constexpr int kVocab = 64;

  FakeModel() {
    config_.architecture = "FakeForCausalLM";
    config_.vocab_size = kVocab;
    config_.hidden_size = 16;
    config_.num_hidden_layers = 1;
    config_.num_attention_heads = 2;
    config_.num_key_value_heads = 2;
    config_.head_dim = 8;
    config_.max_position_embeddings = 256;
  }

  // The greedy token after `context` (the tokens at positions [0, p]): FNV-1a over them, then a
  // finaliser (FNV's low bits alone would repeat: once they reach 0 with token 0, they stay 0).
  static int32_t next_token(std::span<const int32_t> context) {
    uint32_t h = 2166136261u;
    for (int32_t t : context) h = (h ^ static_cast<uint32_t>(t)) * 16777619u;
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    return static_cast<int32_t>(h % kVocab);
  }
  // The greedy continuation of a prompt by `n` tokens: what any schedule must produce.
  static std::vector<int32_t> continuation(std::vector<int32_t> prompt, int n) {
    std::vector<int32_t> out;
    for (int i = 0; i < n; ++i) {
      out.push_back(next_token(prompt));
      prompt.push_back(out.back());
    }
    return out;
  }

  const ModelConfig& config() const override { return config_; }
  size_t weight_bytes() const override { return 0; }
  const std::vector<RecordedBatch>& batches() const { return batches_; }
  void clear_batches() { batches_.clear(); }

  void forward(ForwardBatch& batch, std::vector<float>& logits, const ForwardRequest& request) override {
    batch.validate();
    record(batch);
    MHAKVPool& pool = *batch.token_to_kv_pool;
    SPECULA_CHECK(pool.dtype() == DType::f32, "FakeModel keeps its KV in f32");
    float* k = pool.k_buffer(0).data_as<float>();
    const auto row_width = static_cast<size_t>(config_.num_key_value_heads * config_.head_dim);
    // Like an attention backend: first the new tokens' KV, then every row reads its context.
    for (size_t t = 0; t < batch.out_cache_loc.size(); ++t) {
      float* kv = k + static_cast<size_t>(batch.out_cache_loc[t]) * row_width;
      kv[0] = static_cast<float>(batch.input_ids[t]);
      // position + 1: a slot never written (zeros) matches no position.
      kv[1] = static_cast<float>(batch.positions[t] + 1);
    }
    struct Row {
      size_t token;  // index into the batch's tokens
      int request;
    };
    std::vector<Row> rows;
    size_t offset = 0;
    for (int i = 0; i < batch.batch_size; ++i) {
      const auto n = static_cast<size_t>(batch.query_len(i));
      for (size_t t = request.all_tokens ? 0 : n - 1; t < n; ++t) rows.push_back({offset + t, i});
      offset += n;
    }
    logits.assign(rows.size() * kVocab, 0.0f);
    const SpecInfo* info = batch.spec_info.get();
    const bool tree = batch.forward_mode == ForwardMode::TARGET_VERIFY && info != nullptr && !info->custom_mask.empty();
    for (size_t r = 0; r < rows.size(); ++r) {
      const auto req = static_cast<size_t>(rows[r].request);
      const int32_t* row = batch.req_to_token_pool->row(batch.req_pool_indices[req]);
      const int32_t position = batch.positions[rows[r].token];
      // A tree row reads the request's prefix, then the tree tokens its mask row shows.
      const int32_t prefix = tree ? batch.seq_lens[req] : position + 1;
      std::vector<int32_t> context;
      for (int32_t p = 0; p < prefix; ++p) {
        const float* kv = k + static_cast<size_t>(row[p]) * row_width;
        SPECULA_CHECK(kv[1] == static_cast<float>(p + 1), "KV slot {} holds position {}, read as position {}", row[p],
                      kv[1] - 1, p);
        context.push_back(static_cast<int32_t>(kv[0]));
      }
      if (tree) {
        const auto N = static_cast<size_t>(info->num_draft_tokens);
        size_t mask_offset = 0;
        for (size_t b = 0; b < req; ++b) mask_offset += N * (static_cast<size_t>(batch.seq_lens[b]) + N);
        const size_t i = rows[r].token - req * N;  // the row's node in its tree
        const size_t width = static_cast<size_t>(prefix) + N;
        for (size_t j = 0; j < N; ++j) {
          if (info->custom_mask[mask_offset + i * width + static_cast<size_t>(prefix) + j] != 0) {
            context.push_back(batch.input_ids[req * N + j]);
          }
        }
      }
      logits[r * kVocab + static_cast<size_t>(next_token(context))] = 1.0f;
    }
    if (request.capture != nullptr) fill_capture(batch, *request.capture);
  }

  // What a captured layer holds per token here: [id, position, 0, ...].
  void fill_capture(const ForwardBatch& batch, HiddenCapture& capture) const {
    const int64_t n = batch.num_tokens();
    const auto h = static_cast<size_t>(config_.hidden_size);
    capture.prepare(config_.num_hidden_layers, n, config_.hidden_size);
    for (int64_t t = 0; t < n; ++t) {
      for (size_t e = 0; e < capture.layers.size(); ++e) {
        float* f = capture.data.data() + (static_cast<size_t>(t) * capture.layers.size() + e) * h;
        f[0] = static_cast<float>(batch.input_ids[static_cast<size_t>(t)]);
        f[1] = static_cast<float>(batch.positions[static_cast<size_t>(t)]);
      }
    }
  }

 private:
  void record(const ForwardBatch& b) {
    batches_.push_back({b.forward_mode, b.batch_size, b.input_ids, b.positions, b.seq_lens, b.extend_prefix_lens,
                        b.extend_seq_lens, b.out_cache_loc});
  }

  ModelConfig config_;
  std::vector<RecordedBatch> batches_;
};

}  // namespace specula::testing_fixtures
