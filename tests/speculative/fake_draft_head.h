// FakeDraftHead: a DraftHead for EAGLE-worker tests against FakeModel (tests/runtime/fake_model.h),
// so a speculative run takes milliseconds. It knows the target's rule (FakeModel::next_token over
// the request's tokens, read from the target's KV) and errs by design, so the accept length of
// every cycle is known in advance:
//   - chains (topk 1): the token at depth e = 1 + kv_len % (num_steps + 1) is wrong (none when
//     e > num_steps), so a cycle accepts min(e - 1, tree depth) draft tokens;
//   - trees: at depth d every frontier node's true child has rank (kv_len + d) % topk among its
//     topk children (probabilities decreasing with rank); the head records how deep the true
//     path runs among its candidates, which is what verification must accept when the tree holds
//     every candidate.
// Its extend checks the target features it is given ([token id, position] per pair from
// FakeModel's capture) against the target's KV, so a wrong feature row or a misplaced KV move
// fails the run.
#pragma once

#include <algorithm>
#include <map>
#include <cstdint>
#include <vector>

#include "runtime/fake_model.h"
#include "specula/core/error.h"
#include "specula/runner/model_runner.h"
#include "specula/speculative/draft_head.h"

namespace specula::testing_fixtures {

class FakeDraftHead final : public DraftHead {
 public:
  FakeDraftHead(ModelRunner& target, const SpecParams& params) : target_(target), params_(params) {}

  const SpecParams& params() const override { return params_; }
  int feature_size() const override { return target_.config().hidden_size; }
  const std::vector<int>& capture_layers() const override { return layers_; }
  // The draft tokens each draft() expected verification to accept, per request, in call order.
  const std::vector<int>& expected_accepts() const { return expected_; }
  int extends() const { return extends_; }

  void extend(std::span<DraftExtendItem* const> items) override {
    const auto F = static_cast<size_t>(feature_size());
    for (DraftExtendItem* it : items) {
      if (it->next_tokens.empty()) continue;
      ++extends_;
      // Pairs come in order: each extend starts where the request's last one ended (a request
      // that has none yet starts anywhere: after its cached prefix).
      SPECULA_CHECK(it->state->root_hidden.size() < 2 || it->start == static_cast<int>(it->state->root_hidden[1]),
                    "draft extend of request {} at {}, but its pairs end at {}", it->req_pool_idx, it->start,
                    it->state->root_hidden.size() < 2 ? -1.0f : it->state->root_hidden[1]);
      for (size_t i = 0; i < it->next_tokens.size(); ++i) {
        const int position = it->start + static_cast<int>(i);
        // The draft KV is indexed by the request's slots as its row maps them now.
        pair_at_slot_[target_.req_pool().row(it->req_pool_idx)[position]] = {position, it->next_tokens[i]};
        const float* f = it->features + i * F;
        SPECULA_CHECK(f[0] == static_cast<float>(token_at(it->req_pool_idx, position)) &&
                          f[1] == static_cast<float>(position),
                      "draft extend of request {}: the feature of position {} is [{}, {}], the target holds token {}",
                      it->req_pool_idx, position, f[0], f[1], token_at(it->req_pool_idx, position));
      }
      // The root: the last pair's next token (its KV comes with the next cycle's verify), and where
      // the pairs end.
      it->state->root_hidden = {static_cast<float>(it->next_tokens.back()),
                                static_cast<float>(it->start + static_cast<int>(it->next_tokens.size()))};
      it->state->root_tokens = {it->next_tokens.back()};
      it->state->root_probs = {1.0f};
    }
  }

  void draft(std::span<const DraftRequest> requests, int num_steps, std::vector<DraftCandidates>& candidates) override {
    SPECULA_CHECK(num_steps >= 1 && num_steps <= params_.num_steps && (params_.topk == 1 || num_steps == params_.num_steps),
                  "the fake head drafts chains of 1..{} steps or its tree, not {} steps", params_.num_steps, num_steps);
    candidates.assign(requests.size(), {});
    for (size_t b = 0; b < requests.size(); ++b) {
      const DraftRequest& r = requests[b];
      // Every pair up to the root must be in the draft before it drafts (pairs left pending by
      // cycles with speculation off included).
      SPECULA_CHECK(r.state->root_hidden.size() == 2 && static_cast<int>(r.state->root_hidden[1]) == r.kv_len,
                    "draft of request {} at {}, but its draft pairs end at {}", r.req_pool_idx, r.kv_len,
                    r.state->root_hidden.size() == 2 ? r.state->root_hidden[1] : -1.0f);
      // Every draft pair the draft attends to holds the right pair: written at the slot the row maps
      // the position to (by this request, or by the one whose cached prefix it reuses), with the
      // token that follows the position (the root for the last).
      const int32_t* row = target_.req_pool().row(r.req_pool_idx);
      for (int p = 0; p < r.kv_len; ++p) {
        const int32_t next = p + 1 < r.kv_len ? token_at(r.req_pool_idx, p + 1) : static_cast<int32_t>(r.state->root_hidden[0]);
        const auto at = pair_at_slot_.find(row[p]);
        SPECULA_CHECK(at != pair_at_slot_.end() && at->second == std::make_pair(p, next),
                      "draft of request {}: slot {} of position {} holds no draft pair for it (position {}, next token {})",
                      r.req_pool_idx, row[p], p, at != pair_at_slot_.end() ? at->second.first : -1,
                      at != pair_at_slot_.end() ? at->second.second : -1);
      }
      std::vector<int32_t> context;
      for (int p = 0; p < r.kv_len; ++p) context.push_back(token_at(r.req_pool_idx, p));
      context.push_back(static_cast<int32_t>(r.state->root_hidden.at(0)));
      candidates[b] = params_.topk == 1 ? chain(context, r.kv_len, num_steps) : tree(context, r.kv_len);
    }
  }

  DraftState root_on_host(int32_t, const DraftState& state) const override { return state; }

 private:
  // The token the target's KV holds at `position` of the request.
  int32_t token_at(int32_t req_pool_idx, int position) const {
    const int32_t slot = target_.req_pool().row(req_pool_idx)[position];
    const auto width = static_cast<size_t>(target_.config().num_key_value_heads * target_.config().head_dim);
    return static_cast<int32_t>(target_.kv_pool().k_buffer(0).data_as<const float>()[static_cast<size_t>(slot) * width]);
  }

  // A chain of num_steps tokens; the wrong depth follows the head's largest chain, so a shorter
  // chain may hold only right tokens.
  DraftCandidates chain(std::vector<int32_t> context, int kv_len, int num_steps) {
    const int S = params_.num_steps;
    const int wrong_depth = 1 + kv_len % (S + 1);
    DraftCandidates c;
    for (int d = 1; d <= num_steps; ++d) {
      int32_t t = FakeModel::next_token(context);
      if (d == wrong_depth) t = (t + 1) % FakeModel::kVocab;
      c.tokens.push_back(t);
      c.parents.push_back(d - 2);
      c.scores.push_back(1.0f / static_cast<float>(d));
      c.depths.push_back(d);
      context.push_back(t);
    }
    expected_.push_back(std::min(wrong_depth - 1, num_steps));
    return c;
  }

  DraftCandidates tree(const std::vector<int32_t>& root_context, int kv_len) {
    const int K = params_.topk, S = params_.num_steps;
    DraftCandidates c;
    std::vector<std::vector<int32_t>> contexts;  // per candidate
    std::vector<bool> on_true_path;              // per candidate
    // Level 1: the root's children; later levels: the topk best children of the frontier.
    std::vector<int32_t> frontier = {-1};
    int true_depth = 0;
    for (int d = 1; d <= S; ++d) {
      const auto first = static_cast<int32_t>(c.tokens.size());
      for (int32_t f : frontier) {
        // A copy: contexts grows below.
        const std::vector<int32_t> ctx = f < 0 ? root_context : contexts[static_cast<size_t>(f)];
        const int32_t t = FakeModel::next_token(ctx);
        const int true_rank = (kv_len + d) % K;
        const float parent_score = f < 0 ? 1.0f : c.scores[static_cast<size_t>(f)];
        const bool parent_true = f < 0 || on_true_path[static_cast<size_t>(f)];
        for (int rank = 0, other = 1; rank < K; ++rank) {
          const int32_t token = rank == true_rank ? t : (t + other++) % FakeModel::kVocab;
          c.tokens.push_back(token);
          c.parents.push_back(f);
          c.scores.push_back(parent_score * static_cast<float>(K - rank) / static_cast<float>(K * (K + 1) / 2));
          c.depths.push_back(d);
          std::vector<int32_t> child = ctx;
          child.push_back(token);
          contexts.push_back(std::move(child));
          on_true_path.push_back(parent_true && rank == true_rank);
          if (on_true_path.back()) true_depth = d;
        }
      }
      if (d == S) break;
      // The next frontier: the topk best children of this level (ties to the lower index).
      std::vector<int32_t> level(c.tokens.size() - static_cast<size_t>(first));
      for (size_t i = 0; i < level.size(); ++i) level[i] = first + static_cast<int32_t>(i);
      std::stable_sort(level.begin(), level.end(), [&](int32_t a, int32_t b) {
        return c.scores[static_cast<size_t>(a)] > c.scores[static_cast<size_t>(b)];
      });
      frontier.assign(level.begin(), level.begin() + K);
    }
    expected_.push_back(true_depth);
    return c;
  }

  ModelRunner& target_;
  SpecParams params_;
  std::vector<int> layers_{HiddenCapture::kFinalNormed};
  std::vector<int> expected_;
  std::map<int32_t, std::pair<int, int32_t>> pair_at_slot_;  // draft KV slot -> (position, next token)
  int extends_ = 0;
};

}  // namespace specula::testing_fixtures
