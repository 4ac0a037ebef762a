// The shipped EAGLE and EAGLE-3 heads against the PyTorch reference's golden fixtures
// (speculative/eagle_golden.h), plus the start-up errors for heads that do not fit.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "specula/core/error.h"
#include "specula/model/safetensors.h"
#include "specula/runner/model_runner.h"
#include "specula/speculative/eagle_worker.h"
#include "speculative/eagle_golden.h"
#include "speculative/spec_fixtures.h"

namespace specula {
namespace {

namespace fs = std::filesystem;
using spec_fixtures::head_dir;
using spec_fixtures::kRoot;
using spec_fixtures::kTarget;
using spec_fixtures::Pair;
using spec_fixtures::prefill;
using spec_fixtures::read_json;

class EagleGolden : public ::testing::TestWithParam<EagleKind> {};

TEST_P(EagleGolden, FirstStepTreeAndVerificationMatchTheReference) {
  spec_fixtures::check_golden(GetParam(), Device::cpu(), 2e-4f);
}

INSTANTIATE_TEST_SUITE_P(Heads, EagleGolden, ::testing::Values(EagleKind::EAGLE, EagleKind::EAGLE3),
                         [](const auto& info) { return std::string(eagle_kind_name(info.param)); });

std::string load_error(const fs::path& head, EagleKind kind) {
  Pair pair;
  try {
    EagleHead h(head, kind, pair.runner->llama_model());
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
    const int32_t first = greedy_token(spec_fixtures::last_token_logits(*pair.runner, prompt));
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
