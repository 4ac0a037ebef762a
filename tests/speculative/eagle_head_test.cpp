// The shipped EAGLE and EAGLE-3 heads against the PyTorch reference's golden fixtures
// (tests/data/model_pair/eagle*.json from tools/export/golden.py): the draft's first top-k after
// prompt + the target's greedy token, the first (5, 4, 8) draft tree node by node, and what
// greedy verification accepts from it. Plus the start-up errors for heads that do not fit.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "specula/core/error.h"
#include "specula/model/safetensors.h"
#include "specula/runtime/model_runner.h"
#include "specula/speculative/eagle_worker.h"
#include "speculative/spec_fixtures.h"

namespace specula {
namespace {

namespace fs = std::filesystem;
using spec_fixtures::head_dir;
using spec_fixtures::kRoot;
const fs::path kTarget = kRoot / "models/specula-byte-6m";

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

struct Pair {
  ModelConfig config = load_model_config(kTarget);
  Checkpoint weights{kTarget};
  std::unique_ptr<ModelRunner> runner;
  Pair() {
    ModelRunnerOptions o;
    o.page_size = 16;
    o.max_running_requests = 2;
    runner = std::make_unique<ModelRunner>(config, weights, o);
  }
};

// Prefills the prompt, checks the target's greedy token, runs the draft extend over the prompt's
// pairs and returns the request's row (its scratch slots allocated past the prompt).
int32_t prefill(ModelRunner& runner, EagleWorker& worker, const std::vector<int32_t>& ids, int32_t expect_next,
                DraftState& state) {
  const auto n = static_cast<int32_t>(ids.size());
  const int32_t row = runner.req_pool().alloc(1).value().at(0);
  const int32_t prefix[] = {0}, seq[] = {n + worker.scratch_tokens()}, last[] = {-1};
  const auto slots = runner.allocator().alloc_extend(prefix, seq, last).value();
  runner.req_pool().write(row, 0, slots);
  HiddenCapture capture;
  capture.layers = worker.capture_layers();
  EXPECT_EQ(argmax(spec_fixtures::extend_forward(runner, ids, row, slots, &capture)), expect_next);
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

class EagleGolden : public ::testing::TestWithParam<EagleKind> {};

TEST_P(EagleGolden, FirstStepTreeAndVerificationMatchTheReference) {
  const EagleKind kind = GetParam();
  const fs::path head = head_dir(kind);
  const nlohmann::json golden = read_json(kRoot / (kind == EagleKind::EAGLE ? "tests/data/model_pair/eagle.json"
                                                                             : "tests/data/model_pair/eagle3.json"));
  for (const auto& prompt : golden["prompts"]) {
    SCOPED_TRACE(prompt["prompt"].get<std::string>());
    const std::vector<int32_t> ids = prompt["ids"].get<std::vector<int32_t>>();
    const auto target_next = prompt["target_next"].get<int32_t>();
    {
      // The root's top 8: a chain worker with topk 8 keeps exactly those.
      Pair pair;
      EagleWorker worker(*pair.runner, EagleOptions{kind, head, SpecParams{1, 8, 9}});
      DraftState state;
      prefill(*pair.runner, worker, ids, target_next, state);
      const auto top_ids = prompt["first_step_top_ids"].get<std::vector<int32_t>>();
      const auto top_probs = prompt["first_step_top_probs"].get<std::vector<float>>();
      ASSERT_EQ(state.root_tokens.size(), top_ids.size());
      for (size_t i = 0; i < top_ids.size(); ++i) {
        EXPECT_EQ(state.root_tokens[i], top_ids[i]) << "rank " << i;
        EXPECT_NEAR(state.root_probs[i], top_probs[i], 2e-4) << "rank " << i;
      }
    }
    const auto& tree = prompt["tree"];
    Pair pair;
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
    for (size_t i = 0; i < nodes.size(); ++i) {
      SCOPED_TRACE("node " + std::to_string(i));
      EXPECT_EQ(item.tree.tokens[i + 1], nodes[i]["token"].get<int32_t>());
      EXPECT_EQ(item.tree.parents[i + 1], nodes[i]["parent"].get<int32_t>() + 1);
      EXPECT_EQ(item.tree.depths[i + 1], nodes[i]["depth"].get<int32_t>());
    }
    EXPECT_EQ(item.result.accepted_tokens, tree["accepted"].get<std::vector<int32_t>>());
    EXPECT_EQ(item.result.bonus_token, tree["bonus"].get<int32_t>());
    // One target feature row per accepted node, root included.
    EXPECT_EQ(item.accepted_features.size(), item.result.accepted_nodes.size() * static_cast<size_t>(worker.head().feature_size()));
  }
}

INSTANTIATE_TEST_SUITE_P(Heads, EagleGolden, ::testing::Values(EagleKind::EAGLE, EagleKind::EAGLE3),
                         [](const auto& info) { return std::string(eagle_kind_name(info.param)); });

std::string load_error(const fs::path& head, EagleKind kind) {
  Pair pair;
  try {
    EagleHead h(head, kind, pair.runner->model());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(EagleHeadErrors, AHeadOfTheOtherKindIsRefusedAtStartUp) {
  const std::string as_eagle = load_error(kRoot / "models/specula-byte-6m-eagle3", EagleKind::EAGLE);
  EXPECT_NE(as_eagle.find("is an EAGLE3 head"), std::string::npos) << as_eagle;
  const std::string as_eagle3 = load_error(kRoot / "models/specula-byte-6m-eagle", EagleKind::EAGLE3);
  EXPECT_NE(as_eagle3.find("is an EAGLE head"), std::string::npos) << as_eagle3;
  EXPECT_THROW(parse_eagle_kind("medusa"), Error);
  EXPECT_EQ(parse_eagle_kind("eagle3"), EagleKind::EAGLE3);
}

TEST(EagleHeadErrors, AHeadForAnotherTargetIsRefused) {
  const fs::path dir = fs::temp_directory_path() / ("specula_eagle3_mismatch_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::copy_file(kRoot / "models/specula-byte-6m-eagle3/model.safetensors", dir / "model.safetensors",
                fs::copy_options::overwrite_existing);
  nlohmann::json c = read_json(kRoot / "models/specula-byte-6m-eagle3/config.json");
  c["target_hidden_size"] = 512;
  std::ofstream(dir / "config.json") << c.dump();
  const std::string hidden = load_error(dir, EagleKind::EAGLE3);
  EXPECT_NE(hidden.find("target_hidden_size 512 does not match the target's hidden_size 256"), std::string::npos) << hidden;
  c["target_hidden_size"] = 256;
  c["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = {1, 3, 9};
  std::ofstream(dir / "config.json") << c.dump();
  const std::string layers = load_error(dir, EagleKind::EAGLE3);
  EXPECT_NE(layers.find("target layer 10; the target has 8 layers"), std::string::npos) << layers;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace specula

namespace specula {
namespace {

// After verify cycles, the worker's cached draft state (draft KV extended with the accepted
// tokens' target features) must equal what a fresh prefill of the whole sequence gives.
TEST(EagleCycles, CachedDraftStateEqualsAFreshRecompute) {
  for (EagleKind kind : {EagleKind::EAGLE, EagleKind::EAGLE3}) {
    SCOPED_TRACE(std::string(eagle_kind_name(kind)));
    const fs::path head = head_dir(kind);
    const nlohmann::json golden = read_json(kRoot / "tests/data/model_pair/target.json");
    const std::vector<int32_t> prompt = golden["prompts"][1]["ids"].get<std::vector<int32_t>>();
    Pair pair;
    const SpecParams params{3, 1, 4};
    EagleWorker worker(*pair.runner, EagleOptions{kind, head, params});
    DraftState state;
    std::vector<int32_t> seq = prompt;
    // The target's greedy next token after the prompt, from a plain forward.
    const int32_t first = argmax(spec_fixtures::last_token_logits(*pair.runner, prompt));
    const int32_t row = prefill(*pair.runner, worker, prompt, first, state);
    seq.push_back(first);
    // Three cycles; the request's row keeps its KV slots and gets fresh scratch slots each time.
    for (int cycle = 0; cycle < 3; ++cycle) {
      const int kv = static_cast<int>(seq.size()) - 1;
      CycleItem item;
      item.req_pool_idx = row;
      item.kv_len = kv;
      item.root_token = seq.back();
      item.state = &state;
      worker.run_cycle({&item, 1});
      std::vector<int32_t> emitted = item.result.accepted_tokens;
      emitted.push_back(item.result.bonus_token);
      DraftExtendItem it;
      it.req_pool_idx = row;
      it.start = kv;
      it.next_tokens = emitted;
      it.features = item.accepted_features.data();
      it.state = &state;
      worker.draft_extend({&it, 1});
      seq.insert(seq.end(), emitted.begin(), emitted.end());
      // Scratch past the new KV for the next cycle (the row already maps the old scratch region).
      const int new_kv = static_cast<int>(seq.size()) - 1;
      const int32_t p0[] = {kv + worker.scratch_tokens()}, s0[] = {new_kv + worker.scratch_tokens()},
                    l0[] = {pair.runner->req_pool().row(row)[kv + worker.scratch_tokens() - 1]};
      if (new_kv > kv) {
        const auto more = pair.runner->allocator().alloc_extend(p0, s0, l0).value();
        pair.runner->req_pool().write(row, kv + worker.scratch_tokens(), more);
      }
      // Fresh: a new runner prefilled with seq[:-1], draft extended with the last token.
      Pair fresh;
      EagleWorker fresh_worker(*fresh.runner, EagleOptions{kind, head, params});
      DraftState fresh_state;
      const std::vector<int32_t> history(seq.begin(), seq.end() - 1);
      prefill(*fresh.runner, fresh_worker, history, seq.back(), fresh_state);
      ASSERT_EQ(state.root_tokens, fresh_state.root_tokens) << "cycle " << cycle;
      for (size_t i = 0; i < state.root_probs.size(); ++i) EXPECT_NEAR(state.root_probs[i], fresh_state.root_probs[i], 1e-4);
      for (size_t i = 0; i < state.root_hidden.size(); i += 17) {
        EXPECT_NEAR(state.root_hidden[i], fresh_state.root_hidden[i], 1e-3) << "cycle " << cycle << " hidden " << i;
      }
    }
  }
}

}  // namespace
}  // namespace specula
