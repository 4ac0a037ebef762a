// Tensor parallelism's layout without GPUs: which heads, KV heads, intermediate columns and
// vocabulary rows each rank holds, the refusals, and the shard weight view, checked by rebuilding
// the layer's products from the ranks' slices and comparing them with the whole layer's in
// float64 (column-parallel rows concatenate; row-parallel partial sums add up).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "specula/core/error.h"
#include "specula/model/synthetic.h"
#include "specula/model/tp_shard.h"

namespace specula {
namespace {

ModelConfig llama_shape(int heads, int kv_heads, int inter, int vocab, int head_dim = 16) {
  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.hidden_size = 48;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.head_dim = head_dim;
  c.intermediate_size = inter;
  c.vocab_size = vocab;
  c.num_hidden_layers = 1;
  return c;
}

TEST(TpLayout, Llama3EightBOverTwoAndFourGpus) {
  const ModelConfig c = llama_shape(32, 8, 14336, 128256, 128);
  const TpLayout r0 = tp_layout(c, {0, 2}), r1 = tp_layout(c, {1, 2});
  EXPECT_EQ(r0.q_heads, (TpRange{0, 16}));
  EXPECT_EQ(r1.q_heads, (TpRange{16, 32}));
  EXPECT_EQ(r0.kv_heads, (TpRange{0, 4}));
  EXPECT_EQ(r1.kv_heads, (TpRange{4, 8}));
  EXPECT_FALSE(r1.kv_replicated);
  EXPECT_EQ(r0.intermediate, (TpRange{0, 7168}));
  EXPECT_EQ(r1.intermediate, (TpRange{7168, 14336}));
  EXPECT_EQ(r0.vocab, (TpRange{0, 64128}));
  EXPECT_EQ(r1.vocab, (TpRange{64128, 128256}));
  const ModelConfig shard = tp_shard_config(c, {1, 4});
  EXPECT_EQ(shard.num_attention_heads, 8);
  EXPECT_EQ(shard.num_key_value_heads, 2);
  EXPECT_EQ(shard.intermediate_size, 3584);
  EXPECT_EQ(shard.hidden_size, c.hidden_size);
  EXPECT_EQ(shard.vocab_size, 128256);
}

// Every q head of a rank reads a KV head the rank holds (the model's grouping, q head j reading KV
// head j / (heads / kv_heads)); each KV head is held by the ranks whose q heads read it; vocab
// parts tile the vocabulary on 32-id bounds.
TEST(TpLayout, EveryRanksQueryHeadsFindTheirKvHeads) {
  for (int heads : {4, 8, 32, 64}) {
    for (int kv : {1, 2, 4, 8}) {
      if (kv > heads || heads % kv != 0) continue;
      for (int tp : {1, 2, 4, 8}) {
        const ModelConfig c = llama_shape(heads, kv, 64 * tp, 5000 + 7 * tp);
        if (heads % tp != 0 || (kv % tp != 0 && tp % kv != 0)) {
          EXPECT_THROW(check_tensor_parallel(c, tp), Error) << heads << " " << kv << " " << tp;
          continue;
        }
        int64_t vocab_end = 0;
        for (int r = 0; r < tp; ++r) {
          const TpLayout l = tp_layout(c, {r, tp});
          EXPECT_EQ(l.q_heads.size(), heads / tp);
          EXPECT_EQ(l.kv_heads.size(), std::max(1, kv / tp));
          EXPECT_EQ(l.kv_replicated, kv < tp);
          const int group = heads / kv;
          for (int64_t j = l.q_heads.begin; j < l.q_heads.end; ++j) {
            const int64_t kv_head = j / group;
            EXPECT_TRUE(kv_head >= l.kv_heads.begin && kv_head < l.kv_heads.end)
                << "heads " << heads << " kv " << kv << " tp " << tp << " rank " << r << " q head " << j;
          }
          // Locally, q head j - q_begin reads local KV head (j - q_begin) / local group.
          const int64_t local_group = l.q_heads.size() / l.kv_heads.size();
          for (int64_t j = l.q_heads.begin; j < l.q_heads.end; ++j) {
            EXPECT_EQ(l.kv_heads.begin + (j - l.q_heads.begin) / local_group, j / group);
          }
          EXPECT_EQ(l.vocab.begin, vocab_end);
          EXPECT_EQ(l.vocab.begin % 32, 0);
          EXPECT_GT(l.vocab.size(), 0);
          vocab_end = l.vocab.end;
        }
        EXPECT_EQ(vocab_end, c.vocab_size);
      }
    }
  }
}

TEST(TpLayout, RefusalsNameTheValueAndWhatWouldDivide) {
  auto message = [](const ModelConfig& c, int tp) {
    try {
      check_tensor_parallel(c, tp);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(llama_shape(32, 8, 128, 1000), 3).find("32 attention heads"), std::string::npos);
  EXPECT_NE(message(llama_shape(12, 6, 128, 1000), 4).find("6 KV heads"), std::string::npos);
  EXPECT_NE(message(llama_shape(8, 8, 100, 1000), 8).find("intermediate_size 100"), std::string::npos);
  EXPECT_NE(message(llama_shape(8, 8, 64, 100), 8).find("vocabulary of 100 ids"), std::string::npos);
  EXPECT_NE(message(llama_shape(8, 8, 64, 1000), 0).find("--tp-size 0"), std::string::npos);
  ModelConfig mla = llama_shape(8, 8, 64, 1000);
  mla.mla.kv_lora_rank = 64;
  EXPECT_EQ(message(mla, 2), "no error");
  EXPECT_NE(message(mla, 3).find("8 attention heads"), std::string::npos);
  ModelConfig moe = llama_shape(8, 8, 64, 1000);
  moe.moe.n_routed_experts = 4;
  moe.moe.moe_intermediate_size = 30;
  EXPECT_NE(message(moe, 4).find("moe_intermediate_size 30"), std::string::npos);
  EXPECT_EQ(message(moe, 2), "no error");
  EXPECT_EQ(message(mla, 1), "no error");
}

// f32 tensors by name, as a checkpoint holds them.
class MapWeights final : public WeightSource {
 public:
  std::map<std::string, std::pair<Shape, std::vector<float>>> tensors;
  TensorView get(const std::string& name, const Shape& shape) const override {
    auto& [s, v] = tensors.at(name);
    SPECULA_CHECK(s == shape, "{}: asked for {}, holds {}", name, shape.str(), s.str());
    return TensorView(const_cast<float*>(v.data()), DType::f32, s);
  }
  bool contains(const std::string& name) const override { return tensors.count(name) != 0; }
  size_t total_bytes() const override { return 0; }
  void add(std::mt19937& rng, const std::string& name, Shape shape) {
    std::normal_distribution<float> d(0.f, 1.f);
    std::vector<float> v(static_cast<size_t>(shape.numel()));
    for (float& x : v) x = d(rng);
    tensors[name] = {shape, std::move(v)};
  }
};

std::vector<float> values(const TensorView& t) {
  const auto* p = t.data_as<const float>();
  return std::vector<float>(p, p + t.numel());
}

// y[out] = sum_i w[out, i] x[i] in float64.
std::vector<double> matvec(const std::vector<float>& w, const std::vector<double>& x, int64_t out) {
  const auto in = static_cast<int64_t>(x.size());
  std::vector<double> y(static_cast<size_t>(out), 0.0);
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t i = 0; i < in; ++i) y[static_cast<size_t>(o)] += static_cast<double>(w[static_cast<size_t>(o * in + i)]) * x[static_cast<size_t>(i)];
  }
  return y;
}

// One layer's attention projections and MLP, whole and split 1, 2 and 4 ways (with replicated KV
// heads at 4): concatenated column-parallel outputs equal the whole product's rows, and the
// row-parallel partial sums of o_proj and down_proj (biases on rank 0 only) add up to the whole.
TEST(TpShardWeights, SlicesRebuildTheWholeLayersProducts) {
  std::mt19937 rng(20261129u);
  const ModelConfig c = llama_shape(8, 2, 96, 300);
  const int64_t h = c.hidden_size, D = c.head_dim, q = c.num_attention_heads * D, kv = c.num_key_value_heads * D;
  MapWeights w;
  const std::string p = "model.layers.0.";
  w.add(rng, p + "self_attn.q_proj.weight", {q, h});
  w.add(rng, p + "self_attn.q_proj.bias", {q});
  w.add(rng, p + "self_attn.k_proj.weight", {kv, h});
  w.add(rng, p + "self_attn.v_proj.weight", {kv, h});
  w.add(rng, p + "self_attn.o_proj.weight", {h, q});
  w.add(rng, p + "self_attn.o_proj.bias", {h});
  w.add(rng, p + "mlp.gate_proj.weight", {c.intermediate_size, h});
  w.add(rng, p + "mlp.up_proj.weight", {c.intermediate_size, h});
  w.add(rng, p + "mlp.down_proj.weight", {h, c.intermediate_size});
  w.add(rng, p + "mlp.down_proj.bias", {h});
  w.add(rng, p + "input_layernorm.weight", {h});
  w.add(rng, "lm_head.weight", {c.vocab_size, h});

  std::normal_distribution<double> d(0.0, 1.0);
  std::vector<double> x(static_cast<size_t>(h)), a(static_cast<size_t>(q)), m(static_cast<size_t>(c.intermediate_size));
  for (double& v : x) v = d(rng);
  for (double& v : a) v = d(rng);
  for (double& v : m) v = d(rng);
  auto whole = [&](const std::string& name) { return values(w.get(name, w.tensors.at(name).first)); };
  const std::vector<double> q_whole = matvec(whole(p + "self_attn.q_proj.weight"), x, q);
  const std::vector<double> k_whole = matvec(whole(p + "self_attn.k_proj.weight"), x, kv);
  const std::vector<double> gate_whole = matvec(whole(p + "mlp.gate_proj.weight"), x, c.intermediate_size);
  std::vector<double> o_whole = matvec(whole(p + "self_attn.o_proj.weight"), a, h);
  std::vector<double> down_whole = matvec(whole(p + "mlp.down_proj.weight"), m, h);
  for (int64_t i = 0; i < h; ++i) {
    o_whole[static_cast<size_t>(i)] += whole(p + "self_attn.o_proj.bias")[static_cast<size_t>(i)];
    down_whole[static_cast<size_t>(i)] += whole(p + "mlp.down_proj.bias")[static_cast<size_t>(i)];
  }

  for (int tp : {1, 2, 4}) {
    std::vector<double> o_sum(static_cast<size_t>(h), 0.0), down_sum(static_cast<size_t>(h), 0.0);
    std::vector<double> q_cat, gate_cat;
    for (int r = 0; r < tp; ++r) {
      const TpLayout l = tp_layout(c, {r, tp});
      const ModelConfig sc = tp_shard_config(c, {r, tp});
      const TpShardWeights sw(w, c, {r, tp});
      const int64_t ql = sc.num_attention_heads * D, kvl = sc.num_key_value_heads * D, il = sc.intermediate_size;
      const std::vector<double> qr = matvec(values(sw.get(p + "self_attn.q_proj.weight", {ql, h})), x, ql);
      q_cat.insert(q_cat.end(), qr.begin(), qr.end());
      const std::vector<float> qb = values(sw.get(p + "self_attn.q_proj.bias", {ql}));
      for (int64_t i = 0; i < ql; ++i) EXPECT_EQ(qb[static_cast<size_t>(i)], whole(p + "self_attn.q_proj.bias")[static_cast<size_t>(l.q_heads.begin * D + i)]);
      const std::vector<double> kr = matvec(values(sw.get(p + "self_attn.k_proj.weight", {kvl, h})), x, kvl);
      for (int64_t i = 0; i < kvl; ++i) EXPECT_NEAR(kr[static_cast<size_t>(i)], k_whole[static_cast<size_t>(l.kv_heads.begin * D + i)], 1e-9);
      const std::vector<double> gr = matvec(values(sw.get(p + "mlp.gate_proj.weight", {il, h})), x, il);
      gate_cat.insert(gate_cat.end(), gr.begin(), gr.end());
      // Row-parallel: this rank's input columns only.
      const std::vector<double> a_part(a.begin() + l.q_heads.begin * D, a.begin() + l.q_heads.end * D);
      const std::vector<double> m_part(m.begin() + l.intermediate.begin, m.begin() + l.intermediate.end);
      const std::vector<double> o_part = matvec(values(sw.get(p + "self_attn.o_proj.weight", {h, ql})), a_part, h);
      const std::vector<double> d_part = matvec(values(sw.get(p + "mlp.down_proj.weight", {h, il})), m_part, h);
      const std::vector<float> ob = values(sw.get(p + "self_attn.o_proj.bias", {h}));
      const std::vector<float> db = values(sw.get(p + "mlp.down_proj.bias", {h}));
      for (int64_t i = 0; i < h; ++i) {
        o_sum[static_cast<size_t>(i)] += o_part[static_cast<size_t>(i)] + ob[static_cast<size_t>(i)];
        down_sum[static_cast<size_t>(i)] += d_part[static_cast<size_t>(i)] + db[static_cast<size_t>(i)];
        if (r > 0) EXPECT_EQ(ob[static_cast<size_t>(i)], 0.0f);
      }
      EXPECT_EQ(values(sw.get(p + "input_layernorm.weight", {h})), whole(p + "input_layernorm.weight"));
      EXPECT_EQ(values(sw.get("lm_head.weight", {c.vocab_size, h})), whole("lm_head.weight"));
      EXPECT_THROW(sw.get(p + "self_attn.q_proj.weight", {q + 1, h}), Error);
    }
    for (size_t i = 0; i < q_whole.size(); ++i) EXPECT_NEAR(q_cat[i], q_whole[i], 1e-9) << "tp " << tp;
    for (size_t i = 0; i < gate_whole.size(); ++i) EXPECT_NEAR(gate_cat[i], gate_whole[i], 1e-9) << "tp " << tp;
    for (int64_t i = 0; i < h; ++i) {
      EXPECT_NEAR(o_sum[static_cast<size_t>(i)], o_whole[static_cast<size_t>(i)], 1e-9) << "tp " << tp;
      EXPECT_NEAR(down_sum[static_cast<size_t>(i)], down_whole[static_cast<size_t>(i)], 1e-9) << "tp " << tp;
    }
  }
}

// Routed experts split like the dense MLP, by their own intermediate size, under both naming
// schemes (Qwen3-MoE's mlp.experts.E.{gate,up,down}_proj, Mixtral's block_sparse_moe.experts.E.
// {w1,w3,w2}); the router stays whole.
TEST(TpShardWeights, ExpertsSplitByTheirIntermediateColumns) {
  std::mt19937 rng(7u);
  ModelConfig c = llama_shape(8, 2, 96, 300);
  c.moe.n_routed_experts = 2;
  c.moe.moe_intermediate_size = 40;
  const int64_t h = c.hidden_size, I = 40;
  MapWeights w;
  const std::vector<std::string> rows = {"model.layers.0.mlp.experts.1.gate_proj.weight",
                                         "model.layers.0.mlp.experts.1.up_proj.weight",
                                         "model.layers.0.block_sparse_moe.experts.0.w1.weight",
                                         "model.layers.0.block_sparse_moe.experts.0.w3.weight"};
  const std::vector<std::string> cols = {"model.layers.0.mlp.experts.1.down_proj.weight",
                                         "model.layers.0.block_sparse_moe.experts.0.w2.weight"};
  for (const std::string& n : rows) w.add(rng, n, {I, h});
  for (const std::string& n : cols) w.add(rng, n, {h, I});
  w.add(rng, "model.layers.0.mlp.gate.weight", {2, h});
  for (int r = 0; r < 2; ++r) {
    const TpShardWeights sw(w, c, {r, 2});
    EXPECT_EQ(tp_shard_config(c, {r, 2}).moe.moe_intermediate_size, 20);
    for (const std::string& n : rows) {
      const std::vector<float> part = values(sw.get(n, {20, h}));
      const std::vector<float>& all = w.tensors.at(n).second;
      EXPECT_TRUE(std::equal(part.begin(), part.end(), all.begin() + r * 20 * h)) << n << " rank " << r;
    }
    for (const std::string& n : cols) {
      const std::vector<float> part = values(sw.get(n, {h, 20}));
      const std::vector<float>& all = w.tensors.at(n).second;
      for (int64_t i = 0; i < h; ++i) {
        for (int64_t j = 0; j < 20; ++j) ASSERT_EQ(part[static_cast<size_t>(i * 20 + j)], all[static_cast<size_t>(i * I + r * 20 + j)]) << n;
      }
    }
    EXPECT_EQ(values(sw.get("model.layers.0.mlp.gate.weight", {2, h})), w.tensors.at("model.layers.0.mlp.gate.weight").second);
  }
}

// DeepSeek's multi-head latent attention: the per-head up-projections (q_b_proj, or q_proj
// without a q LoRA, and kv_b_proj) split by head, o_proj by the heads' value columns; the latent
// down-projections and norms whole on every rank; the shared experts split like a dense MLP of
// n_shared_experts x moe_intermediate_size. Checked as in the dense test: concatenated
// column-parallel outputs equal the whole product's, row-parallel partial sums add up.
TEST(TpShardWeights, LatentAttentionSplitsByHeadAndSharedExpertsByColumns) {
  std::mt19937 rng(52u);
  ModelConfig c = llama_shape(8, 8, 96, 300);
  c.architecture = "DeepseekV2ForCausalLM";
  c.mla.q_lora_rank = 24;
  c.mla.kv_lora_rank = 32;
  c.mla.qk_nope_head_dim = 16;
  c.mla.qk_rope_head_dim = 8;
  c.mla.v_head_dim = 12;
  c.moe.n_routed_experts = 4;
  c.moe.n_shared_experts = 2;
  c.moe.moe_intermediate_size = 20;
  const int64_t h = c.hidden_size, H = c.num_attention_heads, qk = 24, kvb = 28, vd = 12, S = 40;
  const int64_t R = c.mla.kv_lora_rank, rope = c.mla.qk_rope_head_dim;
  MapWeights w;
  const std::string p = "model.layers.0.";
  w.add(rng, p + "self_attn.q_a_proj.weight", {24, h});
  w.add(rng, p + "self_attn.q_a_layernorm.weight", {24});
  w.add(rng, p + "self_attn.q_b_proj.weight", {H * qk, 24});
  w.add(rng, p + "self_attn.q_proj.weight", {H * qk, h});
  w.add(rng, p + "self_attn.kv_a_proj_with_mqa.weight", {R + rope, h});
  w.add(rng, p + "self_attn.kv_a_layernorm.weight", {R});
  w.add(rng, p + "self_attn.kv_b_proj.weight", {H * kvb, R});
  w.add(rng, p + "self_attn.o_proj.weight", {h, H * vd});
  w.add(rng, p + "mlp.shared_experts.gate_proj.weight", {S, h});
  w.add(rng, p + "mlp.shared_experts.up_proj.weight", {S, h});
  w.add(rng, p + "mlp.shared_experts.down_proj.weight", {h, S});
  w.add(rng, p + "mlp.gate.weight", {4, h});
  auto whole = [&](const std::string& name) { return values(w.get(name, w.tensors.at(name).first)); };
  std::normal_distribution<double> d(0.0, 1.0);
  auto random = [&](int64_t n) {
    std::vector<double> v(static_cast<size_t>(n));
    for (double& x : v) x = d(rng);
    return v;
  };
  const std::vector<double> x = random(h), qa = random(24), kv_c = random(R), a = random(H * vd), m = random(S);
  const std::vector<double> qb_whole = matvec(whole(p + "self_attn.q_b_proj.weight"), qa, H * qk);
  const std::vector<double> q_whole = matvec(whole(p + "self_attn.q_proj.weight"), x, H * qk);
  const std::vector<double> kvb_whole = matvec(whole(p + "self_attn.kv_b_proj.weight"), kv_c, H * kvb);
  const std::vector<double> gate_whole = matvec(whole(p + "mlp.shared_experts.gate_proj.weight"), x, S);
  const std::vector<double> o_whole = matvec(whole(p + "self_attn.o_proj.weight"), a, h);
  const std::vector<double> down_whole = matvec(whole(p + "mlp.shared_experts.down_proj.weight"), m, h);
  for (int tp : {2, 4}) {
    std::vector<double> qb_cat, q_cat, kvb_cat, gate_cat, o_sum(static_cast<size_t>(h), 0.0), down_sum(static_cast<size_t>(h), 0.0);
    for (int r = 0; r < tp; ++r) {
      const ModelConfig sc = tp_shard_config(c, {r, tp});
      const TpLayout l = tp_layout(c, {r, tp});
      const TpShardWeights sw(w, c, {r, tp});
      const int64_t Hl = sc.num_attention_heads, Sl = static_cast<int64_t>(sc.moe.n_shared_experts) * sc.moe.moe_intermediate_size;
      ASSERT_EQ(Hl, H / tp);
      ASSERT_EQ(Sl, S / tp);
      EXPECT_EQ(sc.mla.kv_lora_rank, R);
      const auto append = [](std::vector<double>& to, const std::vector<double>& part) { to.insert(to.end(), part.begin(), part.end()); };
      append(qb_cat, matvec(values(sw.get(p + "self_attn.q_b_proj.weight", {Hl * qk, 24})), qa, Hl * qk));
      append(q_cat, matvec(values(sw.get(p + "self_attn.q_proj.weight", {Hl * qk, h})), x, Hl * qk));
      append(kvb_cat, matvec(values(sw.get(p + "self_attn.kv_b_proj.weight", {Hl * kvb, R})), kv_c, Hl * kvb));
      append(gate_cat, matvec(values(sw.get(p + "mlp.shared_experts.gate_proj.weight", {Sl, h})), x, Sl));
      const std::vector<double> a_part(a.begin() + l.q_heads.begin * vd, a.begin() + l.q_heads.end * vd);
      const std::vector<double> m_part(m.begin() + r * Sl, m.begin() + (r + 1) * Sl);
      const std::vector<double> o_part = matvec(values(sw.get(p + "self_attn.o_proj.weight", {h, Hl * vd})), a_part, h);
      const std::vector<double> d_part = matvec(values(sw.get(p + "mlp.shared_experts.down_proj.weight", {h, Sl})), m_part, h);
      for (int64_t i = 0; i < h; ++i) {
        o_sum[static_cast<size_t>(i)] += o_part[static_cast<size_t>(i)];
        down_sum[static_cast<size_t>(i)] += d_part[static_cast<size_t>(i)];
      }
      for (const char* n : {"self_attn.q_a_proj.weight", "self_attn.kv_a_proj_with_mqa.weight", "self_attn.kv_a_layernorm.weight",
                            "self_attn.q_a_layernorm.weight", "mlp.gate.weight"}) {
        EXPECT_EQ(values(sw.get(p + n, w.tensors.at(p + n).first)), whole(p + n)) << n;
      }
    }
    for (size_t i = 0; i < qb_whole.size(); ++i) EXPECT_NEAR(qb_cat[i], qb_whole[i], 1e-9) << "tp " << tp;
    for (size_t i = 0; i < q_whole.size(); ++i) EXPECT_NEAR(q_cat[i], q_whole[i], 1e-9) << "tp " << tp;
    for (size_t i = 0; i < kvb_whole.size(); ++i) EXPECT_NEAR(kvb_cat[i], kvb_whole[i], 1e-9) << "tp " << tp;
    for (size_t i = 0; i < gate_whole.size(); ++i) EXPECT_NEAR(gate_cat[i], gate_whole[i], 1e-9) << "tp " << tp;
    for (int64_t i = 0; i < h; ++i) {
      EXPECT_NEAR(o_sum[static_cast<size_t>(i)], o_whole[static_cast<size_t>(i)], 1e-9) << "tp " << tp;
      EXPECT_NEAR(down_sum[static_cast<size_t>(i)], down_whole[static_cast<size_t>(i)], 1e-9) << "tp " << tp;
    }
  }
}

// A synthetic source makes only a rank's part, with the values the whole tensor has there.
TEST(TpShardWeights, SyntheticSlicesEqualTheWholeTensorsParts) {
  const SyntheticWeights w(synthetic_config("tiny"), 3);
  const Shape shape{96, 40};
  const TensorView whole = w.get("model.layers.0.mlp.down_proj.weight", shape);
  const std::vector<uint16_t> all(whole.data_as<const uint16_t>(), whole.data_as<const uint16_t>() + whole.numel());
  for (int dim : {0, 1}) {
    for (auto [b, e] : {std::pair<int64_t, int64_t>{0, 20}, {13, 40}, {7, 8}}) {
      if (e > shape[dim]) continue;
      Buffer part;
      w.read_slice("model.layers.0.mlp.down_proj.weight", shape, dim, b, e, part);
      ASSERT_EQ(part.shape()[dim], e - b);
      const auto* got = part.data_as<const uint16_t>();
      for (int64_t r = 0; r < part.shape()[0]; ++r) {
        for (int64_t c = 0; c < part.shape()[1]; ++c) {
          const int64_t wr = dim == 0 ? r + b : r, wc = dim == 1 ? c + b : c;
          ASSERT_EQ(got[r * part.shape()[1] + c], all[static_cast<size_t>(wr * shape[1] + wc)]) << dim << " " << b;
        }
      }
    }
  }
  Buffer bad;
  EXPECT_THROW(w.read_slice("x", shape, 1, 30, 50, bad), Error);
}

}  // namespace
}  // namespace specula
