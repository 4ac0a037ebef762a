// Routing follows transformers' DeepseekV2MoEGate / DeepseekV3TopkRouter, Qwen3MoeSparseMoeBlock
// and MixtralSparseMoeBlock (scores in f32; the selection's ties go to the lower index, where
// torch.topk leaves the order unspecified).
#include "specula/model/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "specula/core/error.h"
#include "specula/model/cpu_ops.h"

namespace specula {

namespace {

ExpertWeights load_expert(F32WeightLoader& load, const ExpertNames& names, int hidden, int inter) {
  ExpertWeights e;
  e.inter = inter;
  e.w_gate = load(names.gate, {inter, hidden});
  e.w_up = load(names.up, {inter, hidden});
  e.w_down = load(names.down, {hidden, inter});
  return e;
}

// y [n, hidden] = down(silu(gate x) * up x) for x [n, hidden].
void run_expert(const ExpertWeights& e, const float* x, int64_t n, int hidden, std::vector<float>& gate,
                std::vector<float>& up, float* y) {
  gate.resize(static_cast<size_t>(n * e.inter));
  up.resize(gate.size());
  cpu_linear(x, e.w_gate, gate.data(), n, hidden, e.inter);
  cpu_linear(x, e.w_up, up.data(), n, hidden, e.inter);
  cpu_silu_mul(gate, up);
  cpu_linear(gate.data(), e.w_down, y, n, e.inter, hidden);
}

// The k best of `values`, larger first, ties to the lower index.
void top_k(const std::vector<double>& values, int k, std::vector<int32_t>& out) {
  out.resize(values.size());
  std::iota(out.begin(), out.end(), 0);
  std::partial_sort(out.begin(), out.begin() + k, out.end(), [&](int32_t a, int32_t b) {
    return values[static_cast<size_t>(a)] > values[static_cast<size_t>(b)] ||
           (values[static_cast<size_t>(a)] == values[static_cast<size_t>(b)] && a < b);
  });
  out.resize(static_cast<size_t>(k));
}

}  // namespace

size_t MoeWeights::floats() const {
  size_t f = router.size() + correction_bias.size() + shared.w_gate.size() + shared.w_up.size() + shared.w_down.size();
  for (const ExpertWeights& e : experts) f += e.w_gate.size() + e.w_up.size() + e.w_down.size();
  return f;
}

ExpertNames expert_names(const std::string& prefix, const MoeConfig& m, int expert) {
  const std::string p = prefix + (m.mixtral_names ? "block_sparse_moe.experts." : "mlp.experts.") + std::to_string(expert) + ".";
  if (m.mixtral_names) return {p + "w1.weight", p + "w3.weight", p + "w2.weight"};
  return {p + "gate_proj.weight", p + "up_proj.weight", p + "down_proj.weight"};
}

MoeWeights load_moe_weights(F32WeightLoader& load, const std::string& prefix, const ModelConfig& c, bool routed) {
  const MoeConfig& m = c.moe;
  MoeWeights w;
  w.layer = true;
  const std::string p = prefix + (m.mixtral_names ? "block_sparse_moe." : "mlp.");
  w.router = load(p + "gate.weight", {m.n_routed_experts, c.hidden_size});
  if (m.topk_method == MoeConfig::TopK::kNoAuxTc) {
    w.correction_bias = load(p + "gate.e_score_correction_bias", {m.n_routed_experts});
  }
  for (int e = 0; routed && e < m.n_routed_experts; ++e) {
    w.experts.push_back(load_expert(load, expert_names(prefix, m, e), c.hidden_size, m.moe_intermediate_size));
  }
  if (m.n_shared_experts > 0) {
    const std::string sp = p + "shared_experts.";
    w.shared = load_expert(load, {sp + "gate_proj.weight", sp + "up_proj.weight", sp + "down_proj.weight"}, c.hidden_size,
                           m.n_shared_experts * m.moe_intermediate_size);
  }
  return w;
}

void moe_route(const MoeConfig& m, const float* router_logits, const std::vector<float>& correction_bias, int64_t n,
               MoeRoute& route) {
  const int E = m.n_routed_experts, k = m.num_experts_per_tok;
  SPECULA_CHECK(E >= 1 && k >= 1 && k <= E && m.n_group >= 1 && E % m.n_group == 0 && m.topk_group >= 1 &&
                    m.topk_group <= m.n_group,
                "moe_route: {} experts, top {}, {} groups keeping {}: not a valid routing", E, k, m.n_group, m.topk_group);
  const int per_group = E / m.n_group;
  SPECULA_CHECK(m.topk_method != MoeConfig::TopK::kNoAuxTc || per_group >= 2,
                "moe_route: noaux_tc ranks groups by their two best experts; groups hold {}", per_group);
  SPECULA_CHECK(m.topk_method == MoeConfig::TopK::kGreedy || k <= m.topk_group * per_group,
                "moe_route: top {} from {} kept groups of {}", k, m.topk_group, per_group);
  SPECULA_CHECK(correction_bias.empty() || correction_bias.size() == static_cast<size_t>(E),
                "moe_route: {} correction biases for {} experts", correction_bias.size(), E);
  route.experts.assign(static_cast<size_t>(n * k), 0);
  route.weights.assign(static_cast<size_t>(n * k), 0.0f);
  std::vector<double> scores(static_cast<size_t>(E)), choice(static_cast<size_t>(E)), group(static_cast<size_t>(m.n_group));
  std::vector<int32_t> picked, groups;
  for (int64_t t = 0; t < n; ++t) {
    const float* logits = router_logits + t * E;
    // Scores in f32, as the model computes them.
    if (m.sigmoid) {
      for (int e = 0; e < E; ++e) scores[static_cast<size_t>(e)] = static_cast<float>(1.0 / (1.0 + std::exp(-double{logits[e]})));
    } else {
      const float top = *std::max_element(logits, logits + E);
      double z = 0;
      for (int e = 0; e < E; ++e) z += std::exp(double{logits[e]} - top);
      for (int e = 0; e < E; ++e) scores[static_cast<size_t>(e)] = static_cast<float>(std::exp(double{logits[e]} - top) / z);
    }
    for (int e = 0; e < E; ++e) {
      choice[static_cast<size_t>(e)] = scores[static_cast<size_t>(e)] +
                                       (correction_bias.empty() ? 0.0 : static_cast<double>(correction_bias[static_cast<size_t>(e)]));
      if (!correction_bias.empty()) choice[static_cast<size_t>(e)] = static_cast<float>(choice[static_cast<size_t>(e)]);
    }
    if (m.topk_method != MoeConfig::TopK::kGreedy) {
      // A group's rank: its best score, or (noaux_tc) the sum of its two best biased scores.
      for (int g = 0; g < m.n_group; ++g) {
        double best = -INFINITY, second = -INFINITY;
        for (int e = g * per_group; e < (g + 1) * per_group; ++e) {
          const double v = choice[static_cast<size_t>(e)];
          if (v > best) {
            second = best;
            best = v;
          } else if (v > second) {
            second = v;
          }
        }
        group[static_cast<size_t>(g)] =
            m.topk_method == MoeConfig::TopK::kNoAuxTc ? static_cast<double>(static_cast<float>(best + second)) : best;
      }
      top_k(group, m.topk_group, groups);
      // Experts of the other groups are out (-inf, as DeepSeek's inference code, vLLM and SGLang
      // mask them; transformers' 0.0 differs only where a kept expert's biased score is negative).
      std::vector<bool> kept(static_cast<size_t>(m.n_group), false);
      for (int32_t g : groups) kept[static_cast<size_t>(g)] = true;
      for (int e = 0; e < E; ++e) {
        if (!kept[static_cast<size_t>(e / per_group)]) choice[static_cast<size_t>(e)] = -INFINITY;
      }
    }
    top_k(choice, k, picked);
    double sum = 0;
    for (int i = 0; i < k; ++i) sum += scores[static_cast<size_t>(picked[static_cast<size_t>(i)])];
    const bool normalise = m.norm_topk_prob && (k > 1 || m.norm_single);
    for (int i = 0; i < k; ++i) {
      double weight = scores[static_cast<size_t>(picked[static_cast<size_t>(i)])];
      if (normalise) weight /= sum + 1e-20;
      if (!normalise || m.scale_always) weight *= m.routed_scaling_factor;
      route.experts[static_cast<size_t>(t * k + i)] = picked[static_cast<size_t>(i)];
      route.weights[static_cast<size_t>(t * k + i)] = static_cast<float>(weight);
    }
  }
}

size_t moe_unread_bytes(const ModelConfig& c, size_t bytes_per_value) {
  const MoeConfig& m = c.moe;
  size_t bytes = 0;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    if (!m.is_moe_layer(l)) continue;
    bytes += static_cast<size_t>(m.n_routed_experts - m.num_experts_per_tok) * 3 * static_cast<size_t>(c.hidden_size) *
             static_cast<size_t>(m.moe_intermediate_size) * bytes_per_value;
  }
  return bytes;
}

void cpu_moe(const MoeConfig& m, const MoeWeights& w, const float* x, int64_t n, int hidden, float* out) {
  const int E = m.n_routed_experts, k = m.num_experts_per_tok;
  SPECULA_CHECK(w.experts.size() == static_cast<size_t>(E),
                "this model's routed experts were loaded for the GPU only; the CPU forward needs all {}", E);
  std::vector<float> logits(static_cast<size_t>(n * E));
  cpu_linear(x, w.router, logits.data(), n, hidden, E);
  MoeRoute route;
  moe_route(m, logits.data(), w.correction_bias, n, route);
  std::vector<float> gate, up, y;
  std::fill(out, out + n * hidden, 0.0f);
  if (!w.shared.w_gate.empty()) run_expert(w.shared, x, n, hidden, gate, up, out);
  // Each expert runs once over the tokens routed to it (gathered), its rows added back weighted.
  std::vector<std::vector<std::pair<int64_t, float>>> tokens(static_cast<size_t>(E));
  for (int64_t t = 0; t < n; ++t) {
    for (int i = 0; i < k; ++i) {
      const size_t s = static_cast<size_t>(t * k + i);
      tokens[static_cast<size_t>(route.experts[s])].emplace_back(t, route.weights[s]);
    }
  }
  std::vector<float> rows;
  for (int e = 0; e < E; ++e) {
    const auto& list = tokens[static_cast<size_t>(e)];
    if (list.empty()) continue;
    const auto m_rows = static_cast<int64_t>(list.size());
    rows.resize(static_cast<size_t>(m_rows * hidden));
    for (int64_t r = 0; r < m_rows; ++r) std::copy_n(x + list[static_cast<size_t>(r)].first * hidden, hidden, rows.data() + r * hidden);
    y.resize(rows.size());
    run_expert(w.experts[static_cast<size_t>(e)], rows.data(), m_rows, hidden, gate, up, y.data());
    for (int64_t r = 0; r < m_rows; ++r) {
      const auto [t, weight] = list[static_cast<size_t>(r)];
      float* dst = out + t * hidden;
      const float* src = y.data() + r * hidden;
      for (int i = 0; i < hidden; ++i) dst[i] += weight * src[i];
    }
  }
}

}  // namespace specula
