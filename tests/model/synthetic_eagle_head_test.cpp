// Synthetic EAGLE-3 heads: the llama3-8b head config has the published head's shape (checked
// without building its weights), d2t is a valid deterministic mapping, and a head over the tiny
// synthetic target runs on the CPU backend from the target's captured features and from its own
// hidden states.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "specula/attention/backend.h"
#include "specula/kv/mha_kv_pool.h"
#include "specula/kv/req_to_token_pool.h"
#include "specula/model/eagle_head.h"
#include "specula/model/llama.h"
#include "specula/model/synthetic.h"

namespace specula {
namespace {

// draft id i -> i + d2t[i] for every i; fails the test unless distinct and in [0, target_vocab).
std::vector<int64_t> mapped_ids(const SyntheticEagle3Weights& w, int draft_vocab, int target_vocab) {
  const TensorView d2t = w.get("d2t", {draft_vocab});
  EXPECT_EQ(d2t.dtype(), DType::i64);
  std::vector<int64_t> ids;
  for (int i = 0; i < draft_vocab; ++i) ids.push_back(i + d2t.data_as<const int64_t>()[i]);
  for (int64_t id : ids) EXPECT_TRUE(id >= 0 && id < target_vocab) << id;
  EXPECT_EQ(std::set<int64_t>(ids.begin(), ids.end()).size(), ids.size()) << "d2t maps two draft ids to one target id";
  return ids;
}

TEST(SyntheticEagle3Head, Llama3HeadConfigHasThePublishedShape) {
  const ModelConfig target = synthetic_config("llama3-8b");
  const Eagle3HeadConfig head = synthetic_eagle3_head_config(target);
  const ModelConfig& c = head.config;
  EXPECT_EQ(c.architecture, "LlamaForCausalLMEagle3");
  EXPECT_EQ(c.num_hidden_layers, 1);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.intermediate_size, 14336);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_scaling.type, target.rope_scaling.type);  // the head rotates as its target does
  EXPECT_EQ(c.vocab_size, 128256);  // the target's: the head shares its embedding
  EXPECT_EQ(head.draft_vocab_size, 32000);
  EXPECT_EQ(head.target_hidden_size, 4096);
  // SGLang's default aux layers 1, 15, 28 (outputs), i.e. the streams entering 2, 16, 29.
  EXPECT_EQ(head.capture_layers, (std::vector<int>{2, 16, 29}));
  EXPECT_EQ(head.capture_layers.size() * static_cast<size_t>(head.target_hidden_size), 3u * 4096u);  // fc's input
  for (int layer : head.capture_layers) EXPECT_TRUE(layer >= 0 && layer < target.num_hidden_layers) << layer;

  // The source only records shapes until asked (d2t, 32000 ids, is made at once): no weights here.
  const SyntheticEagle3Weights w(head, 1);
  const size_t h = 4096, q = 32 * 128, kv = 8 * 128, inter = 14336;
  const size_t params = h * 3 * h + 4 * h + q * 2 * h + 2 * kv * 2 * h + h * q + 3 * inter * h + 32000 * h;
  EXPECT_EQ(w.total_bytes(), params * 2 + 32000 * 8);
  EXPECT_FALSE(w.contains("embed_tokens.weight"));
  EXPECT_TRUE(w.contains("midlayer.hidden_norm.weight"));
  EXPECT_THROW(w.get("fc.weight", {4096, 4096}), Error);
}

TEST(SyntheticEagle3Head, D2tIsAValidDeterministicMapping) {
  const Eagle3HeadConfig head = synthetic_eagle3_head_config(synthetic_config("llama3-8b"));
  const std::vector<int64_t> a = mapped_ids(SyntheticEagle3Weights(head, 5), 32000, 128256);
  EXPECT_TRUE(std::is_sorted(a.begin(), a.end()));
  EXPECT_EQ(a, mapped_ids(SyntheticEagle3Weights(head, 5), 32000, 128256));
  EXPECT_NE(a, mapped_ids(SyntheticEagle3Weights(head, 6), 32000, 128256));
  // A random subset, not the first 32000 ids.
  EXPECT_GT(a.back(), 100000);
  EXPECT_THROW(synthetic_eagle3_head_config(synthetic_config("deepseek-v2-lite-dense")), Error);
}

// One EXTEND request of `ids` at positions [start, start + n) in request row `row`.
ForwardBatch extend_batch(const std::vector<int32_t>& ids, int32_t row, int start, ReqToTokenPool& req, MHAKVPool& kv) {
  const int n = static_cast<int>(ids.size());
  ForwardBatch b;
  b.forward_mode = ForwardMode::EXTEND;
  b.batch_size = 1;
  b.input_ids = ids;
  for (int i = 0; i < n; ++i) {
    b.positions.push_back(start + i);
    b.out_cache_loc.push_back(req.row(row)[start + i]);
  }
  b.req_pool_indices = {row};
  b.seq_lens = {start + n};
  b.extend_prefix_lens = {start};
  b.extend_seq_lens = {n};
  b.req_to_token_pool = &req;
  b.token_to_kv_pool = &kv;
  return b;
}

void expect_finite_and_varied(const std::vector<float>& v, size_t rows, const char* what) {
  ASSERT_FALSE(v.empty()) << what;
  const size_t width = v.size() / rows;
  for (size_t r = 0; r < rows; ++r) {
    const auto begin = v.begin() + static_cast<int64_t>(r * width), end = begin + static_cast<int64_t>(width);
    EXPECT_TRUE(std::all_of(begin, end, [](float x) { return std::isfinite(x); })) << what << " row " << r;
    const auto [lo, hi] = std::minmax_element(begin, end);
    EXPECT_GT(*hi - *lo, 1e-3f) << what << " row " << r << " is constant";
  }
}

TEST(SyntheticEagle3Head, TinyHeadRunsOnTheCpuBackend) {
  const ModelConfig tc = synthetic_config("tiny");
  const SyntheticWeights target_weights(tc, 7);
  LlamaModel target(tc, target_weights);
  const Eagle3HeadConfig hc = synthetic_eagle3_head_config(tc);
  EXPECT_EQ(hc.config.hidden_size, tc.hidden_size);
  EXPECT_EQ(hc.config.num_attention_heads, tc.num_attention_heads);
  EXPECT_EQ(hc.config.num_key_value_heads, tc.num_key_value_heads);
  const SyntheticEagle3Weights head_weights(hc, 11);
  const EagleHead head(hc, head_weights, target);
  EXPECT_EQ(head.kind(), EagleKind::EAGLE3);
  EXPECT_EQ(head.capture_layers(), (std::vector<int>{2, 4, 5}));  // tiny: 8 layers
  EXPECT_EQ(head.feature_size(), 3 * tc.hidden_size);
  EXPECT_EQ(head.draft_vocab_size(), tc.vocab_size / 2);

  // d2t: distinct target ids in range, and not the identity (the draft vocabulary is a subset).
  std::set<int32_t> targets;
  bool identity = true;
  for (int32_t i = 0; i < head.draft_vocab_size(); ++i) {
    const int32_t t = head.to_target_id(i);
    EXPECT_TRUE(t >= 0 && t < tc.vocab_size) << "draft id " << i << " -> " << t;
    targets.insert(t);
    identity = identity && t == i;
  }
  EXPECT_EQ(static_cast<int>(targets.size()), head.draft_vocab_size());
  EXPECT_FALSE(identity);

  // The target over the prompt captures the head's features; slot 0 stays the padding slot.
  const std::vector<int32_t> prompt = {72, 101, 108, 108, 111, 44};
  const int n = static_cast<int>(prompt.size());
  ReqToTokenPool req(2, 64);
  const int32_t row = req.alloc(1).value().at(0);
  std::vector<int32_t> slots;
  for (int i = 0; i < 16; ++i) slots.push_back(1 + i);
  req.write(row, 0, slots);
  MHAKVPool target_kv({64, tc.num_hidden_layers, tc.num_key_value_heads, tc.head_dim, 0, DType::f32, Device::cpu()});
  MHAKVPool head_kv({64, 1, hc.config.num_key_value_heads, hc.config.head_dim, 0, DType::f32, Device::cpu()});
  auto backend = make_attention_backend("cpu", AttentionBackendOptions{});
  backend->check_layer(head.attention_layer(), DType::f32, DType::f32);

  ForwardBatch tb = extend_batch(prompt, row, 0, req, target_kv);
  backend->init_forward_metadata(tb);
  HiddenCapture capture;
  capture.layers = head.capture_layers();
  std::vector<float> target_logits;
  target.forward(tb, *backend, target_logits, /*all_tokens=*/false, &capture);
  ASSERT_EQ(capture.data.size(), static_cast<size_t>(n * head.feature_size()));

  // Pair convention: (token t + 1, feature of t) at position t; the last pair takes the target's
  // greedy next token.
  std::vector<int32_t> head_ids(prompt.begin() + 1, prompt.end());
  head_ids.push_back(static_cast<int32_t>(std::max_element(target_logits.begin(), target_logits.end()) -
                                          target_logits.begin()));
  ForwardBatch hb = extend_batch(head_ids, row, 0, req, head_kv);
  backend->init_forward_metadata(hb);
  std::vector<float> hidden, logits;
  std::vector<int64_t> rows;
  for (int i = 0; i < n; ++i) rows.push_back(i);
  head.forward(hb, *backend, capture.data.data(), /*from_target=*/true, hidden, rows, logits);
  ASSERT_EQ(hidden.size(), static_cast<size_t>(n * head.hidden_size()));
  ASSERT_EQ(logits.size(), static_cast<size_t>(n * head.draft_vocab_size()));
  expect_finite_and_varied(hidden, static_cast<size_t>(n), "hidden");
  expect_finite_and_varied(logits, static_cast<size_t>(n), "logits");

  // A draft step: the head's own last hidden state with its best draft token, one position on.
  const float* last = logits.data() + static_cast<int64_t>(n - 1) * head.draft_vocab_size();
  const auto best = static_cast<int32_t>(std::max_element(last, last + head.draft_vocab_size()) - last);
  ForwardBatch sb = extend_batch({head.to_target_id(best)}, row, n, req, head_kv);
  sb.forward_mode = ForwardMode::DECODE;
  sb.extend_prefix_lens.clear();
  sb.extend_seq_lens.clear();
  backend->init_forward_metadata(sb);
  std::vector<float> step_hidden, step_logits;
  head.forward(sb, *backend, hidden.data() + static_cast<int64_t>(n - 1) * head.hidden_size(), /*from_target=*/false,
               step_hidden, {0}, step_logits);
  expect_finite_and_varied(step_hidden, 1, "draft step hidden");
  expect_finite_and_varied(step_logits, 1, "draft step logits");
}

}  // namespace
}  // namespace specula
