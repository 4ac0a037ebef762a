// Mixture-of-experts MLP layers on the CPU (DeepSeek-V2/V3, Qwen3-MoE, Mixtral; MoeConfig in
// config.h): the router,
// each token's experts and weights exactly as the model defines them, and the SiLU-gated experts
// run over the tokens routed to each, plus the shared experts every token takes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "specula/model/config.h"
#include "specula/model/weight_loader.h"

namespace specula {

// One SiLU-gated MLP, f32 [out, in] row-major: gate and up [inter, hidden], down [hidden, inter].
struct ExpertWeights {
  std::vector<float> w_gate, w_up, w_down;
  int inter = 0;
};

struct MoeWeights {
  bool layer = false;                  // a mixture-of-experts layer (its routed experts may be held elsewhere)
  std::vector<float> router;           // mlp.gate.weight [n_routed_experts, hidden]
  std::vector<float> correction_bias;  // mlp.gate.e_score_correction_bias [n_routed_experts] (noaux_tc)
  std::vector<ExpertWeights> experts;  // mlp.experts.{e}
  ExpertWeights shared;                // mlp.shared_experts (n_shared_experts x moe_intermediate_size wide)
  size_t floats() const;
};

// Layer `prefix`'s ("model.layers.L.") mixture-of-experts tensors under transformers' names
// (MoeConfig::mixtral_names). routed false: all but the routed experts (a GPU model reads those
// straight from the checkpoint, one at a time, with no f32 copy on the host).
MoeWeights load_moe_weights(F32WeightLoader& load, const std::string& prefix, const ModelConfig& config,
                            bool routed = true);

// The checkpoint names of routed expert e's matrices in layer `prefix`.
struct ExpertNames {
  std::string gate, up, down;
};
ExpertNames expert_names(const std::string& prefix, const MoeConfig& config, int expert);

// Each token's num_experts_per_tok experts and their weights ([n, k] each, by falling selection
// score) from the router's f32 logits [n, n_routed_experts].
struct MoeRoute {
  std::vector<int32_t> experts;
  std::vector<float> weights;
};
void moe_route(const MoeConfig& config, const float* router_logits, const std::vector<float>& correction_bias,
               int64_t n, MoeRoute& route);

// The routed experts' weights a single token does not read, over every MoE layer of `config`, at
// bytes_per_value bytes a weight.
size_t moe_unread_bytes(const ModelConfig& config, size_t bytes_per_value);

// out [n, hidden] = the layer's MLP output for x [n, hidden] (already normed).
void cpu_moe(const MoeConfig& config, const MoeWeights& w, const float* x, int64_t n, int hidden, float* out);

}  // namespace specula
