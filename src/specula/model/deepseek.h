// DeepseekModel: the DeepSeek-V2/V3 decoder on the CPU (weights held as f32, products through
// OpenBLAS), its MLP layers dense or mixtures of experts (model/moe.h). Attention is multi-head latent attention in the absorbed form
// through an MlaAttentionBackend over the latent cache (MLAKVPool):
//   q = q_proj(x), or q_b_proj(q_a_layernorm(q_a_proj(x))); per head q_nope [qk_nope_head_dim] and
//   q_pe [qk_rope_head_dim];
//   [c ; k_pe] = kv_a_proj_with_mqa(x), c = kv_a_layernorm(c); RoPE on q_pe and k_pe;
//   the cache keeps [c ; k_pe] per token (one row for all heads). W_UK[h] and W_UV[h] are head
//   h's rows of kv_b_proj (qk_nope_head_dim key rows, then v_head_dim value rows): head h's query
//   becomes [q_nope W_UK[h] ; q_pe], whose dot product with [c ; k_pe] is the expanded form's
//   q . k; attention returns o[h] = sum_j p_j c_j and the head's value is W_UV[h] o[h]; o_proj.
// The softmax scale is qk_head_dim^-1/2 times YaRN's mscale squared (MlaConfig::softmax_scale).
#pragma once

#include <vector>

#include "specula/attention/mla/mla_backend.h"
#include "specula/model/config.h"
#include "specula/model/cpu_decoder.h"
#include "specula/model/moe.h"
#include "specula/model/weights.h"

namespace specula {

class DeepseekModel : public CpuDecoder {
 public:
  // transformers builds q_a_layernorm and kv_a_layernorm with RMSNorm's default eps, not the
  // config's rms_norm_eps.
  static constexpr float kLatentNormEps = 1e-6f;

  // Throws specula::Error for configs that are not MLA models.
  // routed_experts false: mixture-of-experts layers hold all but their routed experts (a GPU
  // model loads those itself); such a model cannot run forward on the CPU.
  DeepseekModel(const ModelConfig& config, const WeightSource& weights, bool routed_experts = true);

  const std::vector<MlaLayer>& mla_layers() const { return mla_layers_; }
  size_t weight_bytes() const;  // all weights as held (f32)

  // As LlamaModel::forward: f32 logits of each request's last token ([batch_size, vocab]) or of
  // every token with all_tokens. The backend's metadata must be initialised for this batch,
  // which points at its MLAKVPool.
  void forward(const ForwardBatch& batch, MlaAttentionBackend& backend, std::vector<float>& logits,
               bool all_tokens = false);

  // The weights as held (f32, [out, in] row-major), for the CUDA executor.
  struct Layer {
    std::vector<float> input_norm, post_norm;  // [hidden]
    std::vector<float> wq;                     // [heads * qk_head_dim, hidden] when q_lora_rank == 0
    std::vector<float> wq_a, q_a_norm, wq_b;   // [q_lora, hidden], [q_lora], [heads * qk_head_dim, q_lora]
    std::vector<float> wkv_a;                  // [kv_lora_rank + qk_rope_head_dim, hidden]
    std::vector<float> kv_a_norm;              // [kv_lora_rank]
    std::vector<float> wkv_b;                  // [heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank]
    std::vector<float> wo;                     // [hidden, heads * v_head_dim]
    std::vector<float> w_gate, w_up, w_down;  // a dense MLP layer's
    bool is_moe = false;                      // MoeConfig::is_moe_layer: moe holds the MLP
    MoeWeights moe;
  };
  const std::vector<Layer>& layers() const { return layers_; }

 private:
  std::vector<Layer> layers_;
  std::vector<MlaLayer> mla_layers_;
};

}  // namespace specula
