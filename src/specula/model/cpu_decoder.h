// CpuDecoder: what every CPU decoder (LlamaModel, DeepseekModel) holds besides its layers: the
// config, the token embedding, the final norm, the lm_head (or the tied embedding) and the RoPE
// frequencies, with the embedding lookup and the logits head over the last hidden states. The
// GPU executors upload these as they are.
#pragma once

#include <vector>

#include "specula/batch/forward_batch.h"
#include "specula/model/config.h"
#include "specula/model/weight_loader.h"

namespace specula {

class CpuDecoder {
 public:
  const ModelConfig& config() const { return config_; }
  const std::vector<float>& embedding() const { return embed_; }   // [vocab, hidden]
  const std::vector<float>& final_norm() const { return final_norm_; }  // [hidden]
  const std::vector<float>& lm_head() const { return lm_head_.empty() ? embed_ : lm_head_; }  // [vocab, hidden]
  const std::vector<float>& inv_freq() const { return inv_freq_; }  // [rotated dims / 2]
  float rope_attention_factor() const { return rope_attention_factor_; }

 protected:
  explicit CpuDecoder(const ModelConfig& config) : config_(config) {}
  // Loads model.embed_tokens, model.norm (norm_offset added to each value: Gemma's 1 + w) and
  // lm_head unless tied, and computes the config's RoPE frequencies.
  void load_ends(F32WeightLoader& load, float norm_offset);
  // Floats held by the parts above.
  size_t ends_floats() const;
  // x [num_tokens, hidden] = the embedding rows of the batch's ids (each checked) times scale.
  void embed_tokens(const ForwardBatch& batch, float scale, std::vector<float>& x) const;
  // Final norm and lm_head over x [num_tokens, hidden]: see cpu_final_logits.
  void final_logits(const float* x, const ForwardBatch& batch, bool all_tokens, std::vector<float>& logits) const;

  ModelConfig config_;

 private:
  std::vector<float> embed_, final_norm_;
  std::vector<float> lm_head_;  // empty when tied: embed_ is used
  std::vector<float> inv_freq_;
  float rope_attention_factor_ = 1.0f;
};

}  // namespace specula
