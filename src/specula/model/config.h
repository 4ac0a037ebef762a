// ModelConfig: the fields of a Hugging Face config.json that specula's Llama-family models use,
// read and checked once at load. Unsupported architectures and malformed values are one clear
// error naming the field and what is allowed.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace specula {

// Qwen2.5-1M's dual_chunk_attention_config (attention/cpu/dual_chunk.h), with the sparse
// vertical-and-slash prefill pattern it may describe (attention/cpu/dual_chunk_sparse.h).
struct DualChunkAttentionConfig {
  int chunk_size = 0;  // 0: off
  int local_size = 0;
  int original_max_position_embeddings = 0;
  // sparse_attention_config: per layer and query head, the vertical and slash lines kept (a
  // published 30 vertical lines reads as 130, as vLLM reads these configs).
  bool sparse_enabled = false;
  int sparse_threshold = 32768;
  int sparse_last_q = 64;
  std::vector<std::vector<int>> sparse_vertical, sparse_slash;  // [layer][query head]
  bool enabled() const { return chunk_size > 0; }
  int chunk_len() const { return chunk_size - local_size; }
  // The longest context that is ordinary attention: within one chunk and the original context
  // every key is intra-chunk with no temperature. The model is then plain attention with dense
  // prefill (the exact form the sparse pattern approximates), on any backend.
  int64_t plain_up_to() const {
    int64_t n = chunk_len();
    if (original_max_position_embeddings > 0) n = std::min<int64_t>(n, original_max_position_embeddings);
    return n;
  }
  bool active_up_to(int64_t max_kv_len) const { return enabled() && max_kv_len > plain_up_to(); }
};

struct RopeScaling {
  std::string type = "default";  // default, linear, dynamic, llama3, yarn
  double factor = 1.0;
  double low_freq_factor = 1.0;   // llama3
  double high_freq_factor = 4.0;  // llama3
  int original_max_position_embeddings = 0;
  double beta_fast = 32.0;        // yarn
  double beta_slow = 1.0;         // yarn
  double attention_factor = 0.0;  // yarn; 0: from mscale / mscale_all_dim, else 0.1 ln(factor) + 1
  double mscale = 0.0;            // yarn (DeepSeek): cos/sin scale get_mscale(factor, mscale) / ...
  double mscale_all_dim = 0.0;    // ... get_mscale(factor, mscale_all_dim); the softmax scale gets its square
  bool truncate = true;           // yarn: correction range rounded to whole dimensions
};

// DeepSeek-V2/V3 multi-head latent attention. kv_a_proj_with_mqa maps the hidden state to a
// compressed KV of kv_lora_rank values (normalised by kv_a_layernorm) and one shared RoPE key of
// qk_rope_head_dim values; kv_b_proj expands the compressed KV to per-head keys (qk_nope_head_dim)
// and values (v_head_dim). Queries come from q_proj, or through q_a_proj -> q_a_layernorm ->
// q_b_proj when q_lora_rank > 0.
struct MlaConfig {
  int q_lora_rank = 0;
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;
  // RoPE rotates adjacent pairs (2i, 2i + 1) (DeepSeek's checkpoints) instead of halves.
  bool rope_interleave = true;
  // qk_head_dim^-1/2 times YaRN's get_mscale(factor, mscale_all_dim)^2.
  double softmax_scale = 0.0;
};

// Mixture-of-experts MLP layers. DeepSeek-V2/V3: every moe_layer_freq-th layer from
// first_k_dense_replace on; Qwen3-MoE: every decoder_sparse_step-th layer not in mlp_only_layers;
// Mixtral: every layer. Such a layer replaces the dense MLP by n_shared_experts always-on experts
// (DeepSeek) plus num_experts_per_tok of n_routed_experts SiLU-gated experts
// (moe_intermediate_size wide each), chosen per token by a router ([n_routed_experts, hidden]):
//   scores = softmax or sigmoid (scoring_func) of the router's logits (in f32);
//   selection (topk_method): greedy, the top-k scores; group_limited_greedy, the top-k within the
//   topk_group groups (of n_group equal slices) whose best score is highest; noaux_tc (V3), the
//   top-k of scores + e_score_correction_bias within the topk_group groups whose two best biased
//   scores sum highest; the bias only selects, the weights are the unbiased scores;
//   weights: normalised to sum 1 when norm_topk_prob (DeepSeek: and top-k > 1; Mixtral always),
//   times routed_scaling_factor (DeepSeek-V2, as DeepSeek's remote modelling code: only when not
//   normalised; V3: always). The experts of groups not kept are out of the selection (-inf).
// Ties go to the lower expert (group) index.
struct MoeConfig {
  int n_routed_experts = 0;  // 0: every layer is dense
  int num_experts_per_tok = 0;
  int n_shared_experts = 0;
  int moe_intermediate_size = 0;
  std::vector<char> layers;  // per layer: a mixture of experts (1) or dense (0)
  int n_group = 1, topk_group = 1;
  double routed_scaling_factor = 1.0;
  bool sigmoid = false;  // scoring_func: sigmoid (V3) or softmax
  enum class TopK { kGreedy, kGroupLimited, kNoAuxTc } topk_method = TopK::kGreedy;
  bool norm_topk_prob = false;
  bool norm_single = false;   // normalise a single expert's weight too (Qwen3-MoE, Mixtral)
  bool scale_always = false;  // V3: routed_scaling_factor after normalising too
  // Tensor names under model.layers.L.: "mlp.gate" and "mlp.experts.E.{gate,up,down}_proj", or
  // Mixtral's "block_sparse_moe.gate" and "block_sparse_moe.experts.E.{w1,w3,w2}".
  bool mixtral_names = false;

  bool is_moe_layer(int layer) const {
    return layer >= 0 && static_cast<size_t>(layer) < layers.size() && layers[static_cast<size_t>(layer)] != 0;
  }
};

struct ModelConfig {
  std::string architecture;  // e.g. LlamaForCausalLM
  std::string model_type;
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  int head_dim = 0;
  int max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  DualChunkAttentionConfig dual_chunk;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v projections have biases (Qwen2; Llama/Qwen3 attention_bias)
  bool o_proj_bias = false;     // o_proj has a bias (Llama/Qwen3 attention_bias)
  bool mlp_bias = false;        // gate/up/down have biases (Llama mlp_bias)
  bool qk_norm = false;         // RMSNorm over head_dim on q and k before RoPE (Qwen3)
  // Per layer: a sliding window of this many tokens (the query included), or -1 for full
  // attention (Mistral: every layer; Qwen2: only with use_sliding_window, from max_window_layers on).
  std::vector<int> layer_sliding_window;
  // Gemma-2: RMSNorm weights applied as (1 + w), the embedding scaled by sqrt(hidden_size),
  // GeLU-tanh gating, norms around attention and MLP outputs, soft-capped attention and final
  // logits, and a softmax scale of query_pre_attn_scalar^-1/2.
  bool gemma2 = false;
  std::string hidden_act = "silu";  // silu or gelu_pytorch_tanh
  double attn_logit_softcapping = 0.0;
  double final_logit_softcapping = 0.0;
  double query_pre_attn_scalar = 0.0;  // 0: head_dim
  // DeepSeek-V2/V3 (kv_lora_rank > 0). head_dim is then qk_rope_head_dim, the rotated width.
  MlaConfig mla;
  bool is_mla() const { return mla.kv_lora_rank > 0; }
  MoeConfig moe;
  bool has_moe() const { return moe.n_routed_experts > 0; }
  // quantization_config fp8 (DeepSeek-V3's published layout): e4m3 weights with one f32 scale
  // per block of [fp8_block_out, fp8_block_in] values in "<name>_scale_inv"; 0: not quantized.
  int fp8_block_out = 0, fp8_block_in = 0;
  bool fp8_weights() const { return fp8_block_out > 0; }
  int bos_token_id = -1;
  std::vector<int> eos_token_ids;
  std::string torch_dtype = "bfloat16";
};

// Architectures this build can run.
const std::vector<std::string>& supported_architectures();

ModelConfig parse_model_config(const std::string& json_text);
ModelConfig load_model_config(const std::filesystem::path& model_dir);

}  // namespace specula
