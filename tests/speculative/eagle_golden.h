// The shipped heads against the PyTorch reference's golden fixtures
// (tests/data/model_pair/eagle*.json from tools/export/golden.py), on the CPU or a GPU: the
// draft's first top-k after prompt + the target's greedy token, the first (5, 4, 8) draft tree
// node by node, and what greedy verification accepts from it.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <cmath>
#include <memory>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "specula/model/safetensors.h"
#include "specula/runner/model_runner.h"
#include "specula/speculative/eagle_worker.h"
#include "speculative/spec_fixtures.h"

namespace specula::spec_fixtures {

namespace fs = std::filesystem;
inline const fs::path kTarget = kRoot / "models/specula-byte-6m";

inline nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

struct Pair {
  ModelConfig config = load_model_config(kTarget);
  Checkpoint weights{kTarget};
  std::unique_ptr<ModelRunner> runner;
  explicit Pair(Device device = Device::cpu()) {
    ModelRunnerOptions o;
    o.device = device;
    o.page_size = 16;
    o.max_running_requests = 2;
    runner = std::make_unique<ModelRunner>(config, weights, o);
  }
};

// Prefills the prompt, checks the target's greedy token, runs the draft extend over the prompt's
// pairs and returns the request's row (its scratch slots allocated past the prompt).
inline int32_t prefill(ModelRunner& runner, EagleWorker& worker, const std::vector<int32_t>& ids, int32_t expect_next,
                       DraftState& state) {
  const auto n = static_cast<int32_t>(ids.size());
  const int32_t row = runner.req_pool().alloc(1).value().at(0);
  const int32_t prefix[] = {0}, seq[] = {n + worker.scratch_tokens()}, last[] = {-1};
  const auto slots = runner.allocator().alloc_extend(prefix, seq, last).value();
  runner.req_pool().write(row, 0, slots);
  HiddenCapture capture;
  capture.layers = worker.capture_layers();
  EXPECT_EQ(greedy_token(extend_forward(runner, ids, row, slots, &capture)), expect_next);
  DraftExtendItem it;
  it.req_pool_idx = row;
  it.start = 0;
  it.next_tokens.assign(ids.begin() + 1, ids.end());
  it.next_tokens.push_back(expect_next);
  it.features = capture.data.data();
  it.state = &state;
  worker.draft_extend({&it, 1});
  return row;
}

// prob_tolerance: how far the draft's first top-k probabilities may be from the reference's. Two
// tokens whose reference probabilities lie closer than that may trade places (the GPU head's bf16
// KV cache moves probabilities by about 1e-3); the tree is then compared as a set of (depth,
// token) nodes rather than node by node. What verification accepts must match exactly.
inline void check_golden(EagleKind kind, Device device, float prob_tolerance) {
  const fs::path head = head_dir(kind);
  const nlohmann::json golden = read_json(kRoot / (kind == EagleKind::EAGLE ? "tests/data/model_pair/eagle.json"
                                                                             : "tests/data/model_pair/eagle3.json"));
  for (const auto& prompt : golden["prompts"]) {
    SCOPED_TRACE(prompt["prompt"].get<std::string>());
    const std::vector<int32_t> ids = prompt["ids"].get<std::vector<int32_t>>();
    const auto target_next = prompt["target_next"].get<int32_t>();
    bool swapped = false;
    {
      // The root's top 8: a chain worker with topk 8 keeps exactly those.
      Pair pair(device);
      EagleWorker worker(*pair.runner, EagleOptions{kind, head, SpecParams{1, 8, 9}});
      DraftState prefilled;
      const int32_t req = prefill(*pair.runner, worker, ids, target_next, prefilled);
      const DraftState state = worker.root_on_host(req, prefilled);
      const auto top_ids = prompt["first_step_top_ids"].get<std::vector<int32_t>>();
      const auto top_probs = prompt["first_step_top_probs"].get<std::vector<float>>();
      ASSERT_EQ(state.root_tokens.size(), top_ids.size());
      for (size_t i = 0; i < top_ids.size(); ++i) {
        EXPECT_NEAR(state.root_probs[i], top_probs[i], prob_tolerance) << "rank " << i;
        if (state.root_tokens[i] == top_ids[i]) continue;
        swapped = true;
        // A near tie: the token sits at another rank of the reference with nearly the same
        // probability, or takes the last rank from one the reference list does not show.
        bool near_tie = i + 1 == top_ids.size();
        for (size_t j = 0; j < top_ids.size(); ++j) {
          near_tie |= top_ids[j] == state.root_tokens[i] && std::abs(top_probs[j] - top_probs[i]) <= prob_tolerance;
        }
        EXPECT_TRUE(near_tie) << "rank " << i << ": token " << state.root_tokens[i] << " instead of " << top_ids[i];
      }
    }
    const auto& tree = prompt["tree"];
    Pair pair(device);
    const SpecParams params{tree["num_steps"].get<int>(), tree["topk"].get<int>(), tree["num_draft_tokens"].get<int>()};
    EagleWorker worker(*pair.runner, EagleOptions{kind, head, params});
    DraftState state;
    const int32_t row = prefill(*pair.runner, worker, ids, target_next, state);
    CycleItem item;
    item.req_pool_idx = row;
    item.kv_len = static_cast<int>(ids.size());
    item.root_token = target_next;
    item.state = &state;
    worker.run_cycle({&item, 1});
    const auto& nodes = tree["nodes"];
    ASSERT_EQ(item.tree.size(), static_cast<int>(nodes.size()) + 1);
    EXPECT_EQ(item.tree.tokens[0], target_next);
    std::multiset<std::pair<int32_t, int32_t>> got, want;  // (depth, token)
    for (size_t i = 0; i < nodes.size(); ++i) {
      SCOPED_TRACE("node " + std::to_string(i));
      got.insert({item.tree.depths[i + 1], item.tree.tokens[i + 1]});
      want.insert({nodes[i]["depth"].get<int32_t>(), nodes[i]["token"].get<int32_t>()});
      if (swapped) continue;
      EXPECT_EQ(item.tree.tokens[i + 1], nodes[i]["token"].get<int32_t>());
      EXPECT_EQ(item.tree.parents[i + 1], nodes[i]["parent"].get<int32_t>() + 1);
      EXPECT_EQ(item.tree.depths[i + 1], nodes[i]["depth"].get<int32_t>());
    }
    EXPECT_EQ(got, want);
    EXPECT_EQ(item.result.accepted_tokens, tree["accepted"].get<std::vector<int32_t>>());
    EXPECT_EQ(item.result.bonus_token, tree["bonus"].get<int32_t>());
    // One target feature row per accepted node, root included.
    EXPECT_EQ(item.accepted_features.size(),
              item.result.accepted_nodes.size() * static_cast<size_t>(worker.head().feature_size()));
  }
}

}  // namespace specula::spec_fixtures
