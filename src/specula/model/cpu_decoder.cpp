// CpuDecoder: the parts every CPU decoder shares.
#include "specula/model/cpu_decoder.h"

#include <algorithm>

#include "specula/core/error.h"
#include "specula/model/cpu_ops.h"
#include "specula/model/rope.h"

namespace specula {

void CpuDecoder::load_ends(F32WeightLoader& load, float norm_offset) {
  const ModelConfig& c = config_;
  embed_ = load("model.embed_tokens.weight", {c.vocab_size, c.hidden_size});
  final_norm_ = load("model.norm.weight", {c.hidden_size});
  for (float& x : final_norm_) x += norm_offset;
  if (!c.tie_word_embeddings) lm_head_ = load("lm_head.weight", {c.vocab_size, c.hidden_size});
  const RopeFrequencies rope = compute_rope_frequencies(c);
  inv_freq_ = rope.inv_freq;
  rope_attention_factor_ = rope.attention_factor;
}

size_t CpuDecoder::ends_floats() const { return embed_.size() + final_norm_.size() + lm_head_.size(); }

void CpuDecoder::embed_tokens(const ForwardBatch& batch, float scale, std::vector<float>& x) const {
  const int64_t n = batch.num_tokens();
  const int hidden = config_.hidden_size;
  SPECULA_CHECK(static_cast<int64_t>(batch.input_ids.size()) == n && static_cast<int64_t>(batch.positions.size()) == n,
                "batch has {} tokens but {} input_ids and {} positions", n, batch.input_ids.size(), batch.positions.size());
  x.resize(static_cast<size_t>(n * hidden));
  for (int64_t t = 0; t < n; ++t) {
    const int32_t id = batch.input_ids[static_cast<size_t>(t)];
    SPECULA_CHECK(id >= 0 && id < config_.vocab_size, "token id {} is out of range [0, {})", id, config_.vocab_size);
    std::transform(embed_.begin() + static_cast<int64_t>(id) * hidden, embed_.begin() + static_cast<int64_t>(id + 1) * hidden,
                   x.begin() + t * hidden, [scale](float v) { return v * scale; });
  }
}

void CpuDecoder::final_logits(const float* x, const ForwardBatch& batch, bool all_tokens, std::vector<float>& logits) const {
  cpu_final_logits(x, batch, all_tokens, final_norm_, lm_head(), config_.hidden_size, config_.vocab_size,
                   static_cast<float>(config_.rms_norm_eps), logits);
}

}  // namespace specula
