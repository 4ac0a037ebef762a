// DecoderLayerWeights: one Llama-family decoder layer's tensors as the host holds them (f32,
// [out, in] row-major), shared by the target's layers (LlamaModel) and the EAGLE heads' midlayer,
// and cpu_decoder_layer, the layer's forward on the CPU for both. The family's variants are
// optional tensors: biases (Qwen2, mlp_bias), q/k norms (Qwen3), Gemma-2's extra norms, and a
// mixture of experts in place of the MLP (Qwen3-MoE, Mixtral).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "specula/core/tensor.h"
#include "specula/model/config.h"
#include "specula/model/moe.h"

namespace specula {

class CpuRope;

struct DecoderLayerWeights {
  std::vector<float> input_norm, post_norm;          // [hidden]; post_norm precedes the MLP
  std::vector<float> post_attn_norm, post_ffn_norm;  // Gemma-2: norms of the attention / MLP outputs
  std::vector<float> wq, wk, wv, wo;                 // [out, in] row-major
  std::vector<float> bq, bk, bv, bo;                 // [out] (attention_bias / o_proj_bias) or empty
  std::vector<float> b_gate, b_up, b_down;           // [out] (mlp_bias) or empty
  std::vector<float> q_norm, k_norm;                 // [head_dim] (qk_norm) or empty
  std::vector<float> w_gate, w_up, w_down;
  MoeWeights moe;  // a mixture-of-experts layer's MLP (moe.layer) instead of w_gate/up/down

  size_t floats() const;
};

// The shape of one layer's step: attention reads attn_in values per token (hidden, or EAGLE-3's
// 2 x hidden).
struct DecoderLayerDims {
  int hidden = 0;
  int attn_in = 0;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int intermediate = 0;
  float eps = 1e-6f;
  bool gelu = false;  // GeLU-tanh gate (Gemma-2) instead of SiLU
  const MoeConfig* moe = nullptr;  // the routing of the layers whose weights hold experts
};

// The activations of one layer step, reused by every layer of a step (grown as needed).
struct CpuLayerScratch {
  Buffer q, k, v, attn, q3;
  std::vector<float> o, xn, gate, up;
};

// Dual chunk attention's rotary embeddings (attention/cpu/dual_chunk.h): keys at their
// position modulo the chunk length; the query in its intra, successive and inter variants.
struct DualChunkRopes {
  const CpuRope* key;
  const CpuRope* intra;
  const CpuRope* successive;
  const CpuRope* inter;
  // Both set with a sparse prefill pattern: q gets two more variants, successive and inter at
  // their unclamped positions (attention/cpu/dual_chunk_sparse.h); else both nullptr.
  const CpuRope* successive_estimate;
  const CpuRope* inter_estimate;
  // [n] or nullptr: each token's key is multiplied by this as it is written (the long-context
  // temperature of its request's length at that step, as vLLM's dual chunk attention does).
  const float* key_scale;
};

// q, k, v, out: f32 [n, heads, head_dim] views (q: [n, heads, 3 * head_dim] with dual chunk
// attention, 5 * head_dim with its sparse prefill pattern); the hook writes K/V and attends.
using CpuAttend = std::function<void(const TensorView& q, const TensorView& k, const TensorView& v,
                                     const TensorView& out)>;

// One layer over n tokens: q/k/v from attn_input [n, attn_in] (already normed by the caller),
// RoPE, attention through `attend`, then x [n, hidden] (the residual stream) += the attention
// and MLP branches.
void cpu_decoder_layer(const DecoderLayerWeights& w, const DecoderLayerDims& d, int64_t n, const float* attn_input,
                       std::vector<float>& x, const CpuRope& rope, const CpuAttend& attend, CpuLayerScratch& scratch,
                       const DualChunkRopes* dual_chunk = nullptr);

}  // namespace specula
