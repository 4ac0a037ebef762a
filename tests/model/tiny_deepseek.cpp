// The reference follows transformers' DeepseekV2Attention: q_pe and k_pe rotated over pairs,
// keys [k_nope ; k_pe] and values from kv_b_proj applied to the normalised compressed KV, softmax
// scale qk_head_dim^-1/2 times YaRN's mscale(factor, mscale_all_dim)^2.
#include "tiny_deepseek.h"

#include <algorithm>
#include <cmath>
#include <functional>

namespace specula::test {

namespace {

// q_a_layernorm / kv_a_layernorm keep RMSNorm's default eps whatever rms_norm_eps says.
constexpr double kLatentEps = 1e-6;
constexpr double kYarnFactor = 4.0, kYarnOriginal = 64.0, kMscale = 1.0, kMscaleAllDim = 0.8;

double get_mscale(double factor, double m) { return factor <= 1 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; }

using Vec = std::vector<double>;

Vec matvec(const std::vector<float>& w, const Vec& x, int64_t out, int64_t row_offset = 0) {
  Vec y(static_cast<size_t>(out), 0.0);
  const size_t in = x.size();
  for (int64_t o = 0; o < out; ++o) {
    const float* row = w.data() + static_cast<size_t>(row_offset + o) * in;
    for (size_t i = 0; i < in; ++i) y[static_cast<size_t>(o)] += static_cast<double>(row[i]) * x[i];
  }
  return y;
}

Vec rms(const Vec& x, const std::vector<float>& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = w[i] * x[i] * inv;
  return y;
}

// Inverse frequencies of the rope dims (transformers' yarn with truncation, or the default).
Vec inv_freq(const DeepseekShape& s) {
  const int d = s.rope;
  Vec f(static_cast<size_t>(d / 2));
  auto dim_of = [&](double rot) { return d * std::log(kYarnOriginal / (rot * 2 * M_PI)) / (2 * std::log(s.theta)); };
  const double low = std::max(std::floor(dim_of(32.0)), 0.0);
  double high = std::min(std::ceil(dim_of(1.0)), static_cast<double>(d - 1));
  if (high == low) high += 0.001;
  for (int i = 0; i < d / 2; ++i) {
    const double base = std::pow(s.theta, -2.0 * i / d);
    if (!s.yarn) {
      f[static_cast<size_t>(i)] = base;
      continue;
    }
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    f[static_cast<size_t>(i)] = base / kYarnFactor * ramp + base * (1 - ramp);
  }
  return f;
}

void rotate(double* x, const Vec& freq, int position, double factor, bool interleave) {
  const int half = static_cast<int>(freq.size());
  for (int i = 0; i < half; ++i) {
    const double angle = position * freq[static_cast<size_t>(i)];
    const double c = std::cos(angle) * factor, s = std::sin(angle) * factor;
    double& a = interleave ? x[2 * i] : x[i];
    double& b = interleave ? x[2 * i + 1] : x[i + half];
    const double a0 = a, b0 = b;
    a = a0 * c - b0 * s;
    b = b0 * c + a0 * s;
  }
}

// A SiLU-gated MLP under prefix (gate_proj, up_proj, down_proj) of width inter.
Vec mlp(const TinyDeepseek& m, const std::string& prefix, const Vec& x, int inter) {
  const Vec g = matvec(m.weights.at(prefix + "gate_proj.weight"), x, inter);
  const Vec u = matvec(m.weights.at(prefix + "up_proj.weight"), x, inter);
  Vec act(static_cast<size_t>(inter));
  for (int i = 0; i < inter; ++i) {
    const double gi = g[static_cast<size_t>(i)];
    act[static_cast<size_t>(i)] = gi / (1.0 + std::exp(-gi)) * u[static_cast<size_t>(i)];
  }
  return matvec(m.weights.at(prefix + "down_proj.weight"), act, m.shape.hidden);
}

// The indices of the k largest values, ties to the lower index.
std::vector<int> largest(const Vec& v, int k) {
  std::vector<int> idx(v.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int>(i);
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return v[static_cast<size_t>(a)] > v[static_cast<size_t>(b)]; });
  idx.resize(static_cast<size_t>(k));
  return idx;
}

// DeepseekV2MoE / DeepseekV3MoE: the router's scores, the selection, the weights, the experts.
// margin (optional): lowered to the gap between the last expert (and group) picked and the
// first left out, where a rounding difference could change the pick. Softmax scores are compared
// by their logarithms (the logits' gap): an input moved by a relative error moves every logit by
// about as much, whatever its score.
Vec moe_mlp(const TinyDeepseek& m, const std::string& p, const Vec& x, double* margin) {
  const DeepseekShape& s = m.shape;
  const bool v3 = s.arch == "DeepseekV3ForCausalLM";
  const Vec logits = matvec(m.weights.at(p + "mlp.gate.weight"), x, s.experts);
  Vec scores(logits.size());
  if (v3) {
    for (size_t e = 0; e < scores.size(); ++e) scores[e] = 1.0 / (1.0 + std::exp(-logits[e]));
  } else {
    const double top = *std::max_element(logits.begin(), logits.end());
    double z = 0;
    for (size_t e = 0; e < scores.size(); ++e) z += scores[e] = std::exp(logits[e] - top);
    for (double& v : scores) v /= z;
  }
  auto gap = [&](double picked, double left) { return v3 ? picked - left : std::log(picked) - std::log(left); };
  Vec choice = scores;
  if (s.topk_method == "noaux_tc") {
    const std::vector<float>& bias = m.weights.at(p + "mlp.gate.e_score_correction_bias");
    for (size_t e = 0; e < choice.size(); ++e) choice[e] += bias[e];
  }
  if (s.topk_method != "greedy") {
    const int per = s.experts / s.n_group;
    Vec group(static_cast<size_t>(s.n_group));
    for (int g = 0; g < s.n_group; ++g) {
      Vec in(choice.begin() + g * per, choice.begin() + (g + 1) * per);
      std::sort(in.begin(), in.end(), std::greater<>());
      group[static_cast<size_t>(g)] = s.topk_method == "noaux_tc" ? in[0] + in[1] : in[0];
    }
    const std::vector<int> kept = largest(group, s.topk_group);
    // A near tie matters only between candidates whose weight is not negligible (a flip between
    // two experts scoring 1e-8 moves the output by about that much).
    if (margin != nullptr && s.topk_group < s.n_group) {
      Vec sorted = group;
      std::sort(sorted.begin(), sorted.end(), std::greater<>());
      if (std::fabs(sorted[static_cast<size_t>(s.topk_group - 1)]) > 1e-4) {
        *margin = std::min(*margin, gap(sorted[static_cast<size_t>(s.topk_group - 1)], sorted[static_cast<size_t>(s.topk_group)]));
      }
    }
    for (int e = 0; e < s.experts; ++e) {
      if (std::find(kept.begin(), kept.end(), e / per) == kept.end()) choice[static_cast<size_t>(e)] = -INFINITY;
    }
  }
  const std::vector<int> picked = largest(choice, s.top_k);
  if (margin != nullptr && s.top_k < s.experts) {
    Vec sorted = choice;
    std::sort(sorted.begin(), sorted.end(), std::greater<>());
    if (std::isfinite(sorted[static_cast<size_t>(s.top_k)]) && std::fabs(sorted[static_cast<size_t>(s.top_k - 1)]) > 1e-4) {
      *margin = std::min(*margin, gap(sorted[static_cast<size_t>(s.top_k - 1)], sorted[static_cast<size_t>(s.top_k)]));
    }
  }
  Vec weight;
  double sum = 0;
  for (int e : picked) sum += scores[static_cast<size_t>(e)];
  const bool normalise = s.top_k > 1 && s.norm_topk;
  for (int e : picked) {
    double w = scores[static_cast<size_t>(e)];
    if (normalise) w /= sum + 1e-20;
    if (!normalise || v3) w *= s.scaling;
    weight.push_back(w);
  }
  Vec out(static_cast<size_t>(s.hidden), 0.0);
  if (s.shared > 0) out = mlp(m, p + "mlp.shared_experts.", x, s.shared * s.moe_inter);
  for (size_t i = 0; i < picked.size(); ++i) {
    const Vec y = mlp(m, p + "mlp.experts." + std::to_string(picked[i]) + ".", x, s.moe_inter);
    for (int j = 0; j < s.hidden; ++j) out[static_cast<size_t>(j)] += weight[i] * y[static_cast<size_t>(j)];
  }
  return out;
}

}  // namespace

TinyDeepseek make_tiny_deepseek(const DeepseekShape& s, uint32_t seed) {
  TinyDeepseek m{s, {}};
  std::mt19937 rng(seed);
  TinyWeights& w = m.weights;
  const int qk = s.nope + s.rope;
  w.add(rng, "model.embed_tokens.weight", {s.vocab, s.hidden}, 1.0f);
  w.add(rng, "model.norm.weight", {s.hidden}, 0.1f, 1.0f);
  w.add(rng, "lm_head.weight", {s.vocab, s.hidden}, 0.2f);
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    w.add(rng, p + "input_layernorm.weight", {s.hidden}, 0.1f, 1.0f);
    w.add(rng, p + "post_attention_layernorm.weight", {s.hidden}, 0.1f, 1.0f);
    if (s.q_lora > 0) {
      w.add(rng, p + "self_attn.q_a_proj.weight", {s.q_lora, s.hidden}, 0.2f);
      w.add(rng, p + "self_attn.q_a_layernorm.weight", {s.q_lora}, 0.1f, 1.0f);
      w.add(rng, p + "self_attn.q_b_proj.weight", {s.heads * qk, s.q_lora}, 0.2f);
    } else {
      w.add(rng, p + "self_attn.q_proj.weight", {s.heads * qk, s.hidden}, 0.2f);
    }
    w.add(rng, p + "self_attn.kv_a_proj_with_mqa.weight", {s.kv_lora + s.rope, s.hidden}, 0.2f);
    w.add(rng, p + "self_attn.kv_a_layernorm.weight", {s.kv_lora}, 0.1f, 1.0f);
    // Small enough that the attention scores (over kv_lora_rank-wide latents) stay O(1): a
    // saturated softmax would amplify rounding and test less of it.
    w.add(rng, p + "self_attn.kv_b_proj.weight", {s.heads * (s.nope + s.v), s.kv_lora}, 0.05f);
    w.add(rng, p + "self_attn.o_proj.weight", {s.hidden, s.heads * s.v}, 0.2f);
    if (s.experts > 0 && l >= s.first_dense) {
      // A router wide enough that tokens pick different experts.
      w.add(rng, p + "mlp.gate.weight", {s.experts, s.hidden}, 0.5f);
      if (s.topk_method == "noaux_tc") w.add(rng, p + "mlp.gate.e_score_correction_bias", {s.experts}, 0.3f);
      for (int e = 0; e < s.experts; ++e) {
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        w.add(rng, x + "gate_proj.weight", {s.moe_inter, s.hidden}, 0.3f);
        w.add(rng, x + "up_proj.weight", {s.moe_inter, s.hidden}, 0.3f);
        w.add(rng, x + "down_proj.weight", {s.hidden, s.moe_inter}, 0.3f);
      }
      if (s.shared > 0) {
        const std::string x = p + "mlp.shared_experts.";
        w.add(rng, x + "gate_proj.weight", {s.shared * s.moe_inter, s.hidden}, 0.2f);
        w.add(rng, x + "up_proj.weight", {s.shared * s.moe_inter, s.hidden}, 0.2f);
        w.add(rng, x + "down_proj.weight", {s.hidden, s.shared * s.moe_inter}, 0.2f);
      }
      continue;
    }
    w.add(rng, p + "mlp.gate_proj.weight", {s.inter, s.hidden}, 0.2f);
    w.add(rng, p + "mlp.up_proj.weight", {s.inter, s.hidden}, 0.2f);
    w.add(rng, p + "mlp.down_proj.weight", {s.hidden, s.inter}, 0.2f);
  }
  return m;
}

nlohmann::json deepseek_config(const DeepseekShape& s) {
  nlohmann::json c = {{"architectures", {s.arch}}, {"model_type", s.arch == "DeepseekV3ForCausalLM" ? "deepseek_v3" : "deepseek_v2"},
                      {"vocab_size", s.vocab}, {"hidden_size", s.hidden}, {"intermediate_size", s.inter},
                      {"moe_intermediate_size", 32}, {"num_hidden_layers", s.layers},
                      {"num_attention_heads", s.heads}, {"num_key_value_heads", s.heads},
                      {"kv_lora_rank", s.kv_lora}, {"qk_nope_head_dim", s.nope}, {"qk_rope_head_dim", s.rope},
                      {"v_head_dim", s.v}, {"rms_norm_eps", s.eps}, {"rope_theta", s.theta},
                      {"max_position_embeddings", 256}, {"tie_word_embeddings", false}, {"hidden_act", "silu"},
                      {"attention_bias", false}, {"n_routed_experts", nullptr}, {"first_k_dense_replace", 0},
                      {"bos_token_id", 256}, {"eos_token_id", 257}};
  c["q_lora_rank"] = s.q_lora > 0 ? nlohmann::json(s.q_lora) : nlohmann::json(nullptr);
  if (s.arch == "DeepseekV3ForCausalLM") c["rope_interleave"] = s.interleave;
  if (s.experts > 0) {
    const bool v3 = s.arch == "DeepseekV3ForCausalLM";
    c["n_routed_experts"] = s.experts;
    c["num_experts_per_tok"] = s.top_k;
    c["n_shared_experts"] = s.shared > 0 ? nlohmann::json(s.shared) : nlohmann::json(nullptr);
    c["moe_intermediate_size"] = s.moe_inter;
    c["first_k_dense_replace"] = s.first_dense;
    c["moe_layer_freq"] = 1;
    c["n_group"] = s.n_group;
    c["topk_group"] = s.topk_group;
    c["topk_method"] = s.topk_method;
    c["scoring_func"] = v3 ? "sigmoid" : "softmax";
    c["norm_topk_prob"] = s.norm_topk;
    c["routed_scaling_factor"] = s.scaling;
  }
  if (s.yarn) {
    c["rope_scaling"] = {{"type", "yarn"}, {"factor", kYarnFactor}, {"original_max_position_embeddings", kYarnOriginal},
                         {"beta_fast", 32}, {"beta_slow", 1}, {"mscale", kMscale}, {"mscale_all_dim", kMscaleAllDim}};
  }
  return c;
}

std::vector<double> deepseek_reference_logits(const TinyDeepseek& model, MlaKVFormat cache,
                                              const std::vector<int32_t>& ids, double* routing_margin) {
  if (routing_margin != nullptr) *routing_margin = INFINITY;
  const DeepseekShape& s = model.shape;
  auto W = [&](const std::string& name) -> const std::vector<float>& { return model.weights.at(name); };
  const int n = static_cast<int>(ids.size()), H = s.hidden, qk = s.nope + s.rope;
  const Vec freq = inv_freq(s);
  const double rope_factor = s.yarn ? get_mscale(kYarnFactor, kMscale) / get_mscale(kYarnFactor, kMscaleAllDim) : 1.0;
  double scale = 1.0 / std::sqrt(static_cast<double>(qk));
  if (s.yarn) scale *= get_mscale(kYarnFactor, kMscaleAllDim) * get_mscale(kYarnFactor, kMscaleAllDim);
  std::vector<Vec> h(static_cast<size_t>(n), Vec(static_cast<size_t>(H)));
  for (int t = 0; t < n; ++t) {
    for (int i = 0; i < H; ++i) h[static_cast<size_t>(t)][static_cast<size_t>(i)] = W("model.embed_tokens.weight")[static_cast<size_t>(ids[static_cast<size_t>(t)] * H + i)];
  }
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    std::vector<Vec> q(static_cast<size_t>(n)), k(static_cast<size_t>(n)), v(static_cast<size_t>(n));
    for (int t = 0; t < n; ++t) {
      const Vec x = rms(h[static_cast<size_t>(t)], W(p + "input_layernorm.weight"), s.eps);
      Vec& qt = q[static_cast<size_t>(t)];
      if (s.q_lora > 0) {
        const Vec qa = rms(matvec(W(p + "self_attn.q_a_proj.weight"), x, s.q_lora), W(p + "self_attn.q_a_layernorm.weight"), kLatentEps);
        qt = matvec(W(p + "self_attn.q_b_proj.weight"), qa, s.heads * qk);
      } else {
        qt = matvec(W(p + "self_attn.q_proj.weight"), x, s.heads * qk);
      }
      for (int hd = 0; hd < s.heads; ++hd) rotate(qt.data() + hd * qk + s.nope, freq, t, rope_factor, s.interleave);
      const Vec kv_a = matvec(W(p + "self_attn.kv_a_proj_with_mqa.weight"), x, s.kv_lora + s.rope);
      Vec c = rms(Vec(kv_a.begin(), kv_a.begin() + s.kv_lora), W(p + "self_attn.kv_a_layernorm.weight"), kLatentEps);
      Vec k_pe(kv_a.begin() + s.kv_lora, kv_a.end());
      rotate(k_pe.data(), freq, t, rope_factor, s.interleave);
      // The cache keeps [c ; k_pe] in its format: keys and values see the decoded row.
      std::vector<float> row_in(c.begin(), c.end()), pe_in(k_pe.begin(), k_pe.end());
      std::vector<uint8_t> row(static_cast<size_t>(mla_row_bytes(cache, s.kv_lora, s.rope)));
      std::vector<float> decoded(static_cast<size_t>(s.kv_lora + s.rope));
      encode_mla_row(cache, row_in.data(), pe_in.data(), s.kv_lora, s.rope, row.data());
      decode_mla_row(cache, row.data(), s.kv_lora, s.rope, decoded.data());
      c.assign(decoded.begin(), decoded.begin() + s.kv_lora);
      k_pe.assign(decoded.begin() + s.kv_lora, decoded.end());
      const Vec kv = matvec(W(p + "self_attn.kv_b_proj.weight"), c, s.heads * (s.nope + s.v));
      Vec& kt = k[static_cast<size_t>(t)];
      Vec& vt = v[static_cast<size_t>(t)];
      for (int hd = 0; hd < s.heads; ++hd) {
        const auto head = kv.begin() + hd * (s.nope + s.v);
        kt.insert(kt.end(), head, head + s.nope);
        kt.insert(kt.end(), k_pe.begin(), k_pe.end());
        vt.insert(vt.end(), head + s.nope, head + s.nope + s.v);
      }
    }
    for (int t = 0; t < n; ++t) {
      Vec attn(static_cast<size_t>(s.heads * s.v), 0.0);
      for (int hd = 0; hd < s.heads; ++hd) {
        Vec score(static_cast<size_t>(t + 1));
        double mx = -INFINITY;
        for (int j = 0; j <= t; ++j) {
          double dot = 0;
          for (int d = 0; d < qk; ++d) dot += q[static_cast<size_t>(t)][static_cast<size_t>(hd * qk + d)] * k[static_cast<size_t>(j)][static_cast<size_t>(hd * qk + d)];
          score[static_cast<size_t>(j)] = dot * scale;
          mx = std::max(mx, score[static_cast<size_t>(j)]);
        }
        double z = 0;
        for (double& sc : score) z += (sc = std::exp(sc - mx));
        for (int j = 0; j <= t; ++j) {
          for (int d = 0; d < s.v; ++d) attn[static_cast<size_t>(hd * s.v + d)] += score[static_cast<size_t>(j)] / z * v[static_cast<size_t>(j)][static_cast<size_t>(hd * s.v + d)];
        }
      }
      const Vec o = matvec(W(p + "self_attn.o_proj.weight"), attn, H);
      Vec& ht = h[static_cast<size_t>(t)];
      for (int i = 0; i < H; ++i) ht[static_cast<size_t>(i)] += o[static_cast<size_t>(i)];
      const Vec x = rms(ht, W(p + "post_attention_layernorm.weight"), s.eps);
      const Vec d = s.experts > 0 && l >= s.first_dense ? moe_mlp(model, p, x, routing_margin) : mlp(model, p + "mlp.", x, s.inter);
      for (int i = 0; i < H; ++i) ht[static_cast<size_t>(i)] += d[static_cast<size_t>(i)];
    }
  }
  std::vector<double> logits;
  for (int t = 0; t < n; ++t) {
    const Vec row = matvec(W("lm_head.weight"), rms(h[static_cast<size_t>(t)], W("model.norm.weight"), s.eps), s.vocab);
    logits.insert(logits.end(), row.begin(), row.end());
  }
  return logits;
}

void quantize_deepseek_fp8(TinyDeepseek& model, int block) {
  std::vector<std::string> names;
  for (const auto& [name, shape] : model.weights.shapes) {
    if (shape.size() == 2 && name.size() > 12 && name.compare(name.size() - 12, 12, "_proj.weight") == 0) names.push_back(name);
  }
  for (const std::string& name : names) quantize_fp8_blocks(model.weights, name, block, block);
}

void add_fp8_quantization_config(nlohmann::json& config, int block) {
  config["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"},
                                   {"weight_block_size", {block, block}}};
}

LogitError logit_error(const std::vector<float>& got, const std::vector<double>& want) {
  LogitError e;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    e.finite = e.finite && std::isfinite(got[i]);
    e.max_err = std::max(e.max_err, std::fabs(got[i] - want[i]));
    e.max_abs = std::max(e.max_abs, std::fabs(want[i]));
  }
  return e;
}

GreedyCheck check_greedy(const TinyDeepseek& model, MlaKVFormat cache, const std::vector<int32_t>& prompt,
                         const std::vector<int32_t>& output, double margin, double routing_margin) {
  GreedyCheck result;
  std::vector<int32_t> seq = prompt;
  for (int32_t token : output) {
    double routing = INFINITY;
    const auto logits = deepseek_reference_logits(model, cache, seq, &routing);
    std::vector<double> row(logits.end() - model.shape.vocab, logits.end());
    const auto best = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
    std::vector<double> sorted = row;
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
    if (sorted[0] - sorted[1] > margin && routing > routing_margin) {
      ++result.checked;
      if (token != best) {
        result.mismatches.push_back("step " + std::to_string(seq.size() - prompt.size()) + ": got " +
                                    std::to_string(token) + ", reference " + std::to_string(best));
      }
    }
    seq.push_back(token);
  }
  return result;
}

GreedyCheck decode_and_check(Generator& gen, const TinyDeepseek& model, MlaKVFormat cache,
                             const std::vector<int32_t>& prompt, int max_new, const LogitError& prompt_error,
                             double routing_margin) {
  GenerateRequest r;
  r.prompt_ids = prompt;
  r.max_new_tokens = max_new;
  r.ignore_eos = true;
  const std::vector<int32_t> out = gen.generate(r).output_ids;
  const double margin = std::max(4 * prompt_error.max_err, 1e-3 * prompt_error.max_abs);
  GreedyCheck check = check_greedy(model, cache, prompt, out, margin, routing_margin);
  if (static_cast<int>(out.size()) != max_new) {
    check.mismatches.push_back(std::to_string(out.size()) + " tokens generated, " + std::to_string(max_new) + " asked");
  }
  return check;
}

}  // namespace specula::test
