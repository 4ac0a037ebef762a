// EagleHead: an EAGLE or EAGLE-3 draft head (SGLang's llama_eagle.py / llama_eagle3.py layouts,
// so heads published for Llama-3.1-8B load unchanged), executed on the CPU in f32.
//
// EAGLE (`LlamaForCausalLMEagle`): x = fc([embed(token) ; feature]) where the feature is the
// target's final normed hidden state; one Llama decoder layer without input_layernorm; its output
// goes to the target's lm_head without a norm and is the next step's feature.
// EAGLE-3 (`LlamaForCausalLMEagle3`): the feature is the target's residual streams entering three
// layers, concatenated and fused by fc [3 target_hidden -> hidden] (draft steps feed back the
// head's own hidden state instead); the midlayer attends over [input_layernorm(embed(token)) ;
// hidden_norm(hidden)] (q/k/v take 2 x hidden inputs) with the hidden as its residual; norm then
// the head's own lm_head over a draft vocabulary, mapped to target ids by d2t
// (target = draft + d2t[draft]).
// Pair convention: the pair (token t+1, feature of position t) sits at RoPE position t.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "specula/attention/backend.h"
#include "specula/model/config.h"
#include "specula/model/decoder_layer.h"
#include "specula/model/hidden_capture.h"
#include "specula/model/llama.h"
#include "specula/model/weights.h"

namespace specula {

enum class EagleKind { EAGLE, EAGLE3 };

// The head's tensors in f32, as the checkpoint holds them.
struct EagleWeights {
  std::vector<float> embed;  // [vocab, hidden] when the head ships its own; else empty (the target's)
  std::vector<float> fc, fc_bias;
  std::vector<float> input_norm, hidden_norm, final_norm;  // EAGLE-3 norms (of the embedding, the hidden state, the output)
  // The midlayer (a Llama decoder layer without input_layernorm; q/k/v read 2 x hidden inputs
  // for EAGLE-3).
  DecoderLayerWeights layer;
  std::vector<float> lm_head;  // EAGLE-3 [draft_vocab, hidden]
  std::vector<int64_t> d2t;    // EAGLE-3 [draft_vocab]
};

// What an EAGLE-3 head is besides its tensors: what its config.json says, resolved against the
// target (the folder constructor derives it from the file; synthetic heads state it directly).
struct Eagle3HeadConfig {
  // The midlayer's shape (hidden, heads, head_dim, intermediate, eps, RoPE); vocab_size is the
  // target's (the head shares its embedding).
  ModelConfig config;
  int target_hidden_size = 0;       // width of each captured target stream; fc reads 3 x this
  std::vector<int> capture_layers;  // the streams entering these target layers (HiddenCapture::layers)
  int draft_vocab_size = 0;         // rows of the head's lm_head and of d2t
};

// SGLang's default EAGLE-3 capture for a target of `target_layers` layers: the outputs of layers
// 1, L/2 - 1 and L - 4 (eagle_aux_hidden_state_layer_ids), i.e. the streams entering 2, L/2, L - 3.
std::vector<int> default_eagle3_capture_layers(int target_layers);

std::string_view eagle_kind_name(EagleKind kind);
// "EAGLE" or "EAGLE3" (case-insensitive); throws specula::Error naming the allowed values.
EagleKind parse_eagle_kind(std::string_view name);

class EagleHead {
 public:
  // Loads the head in `dir` (config.json + safetensors) for `target`. Throws specula::Error at
  // once when the head is not of `kind` (e.g. an EAGLE-3 head given as EAGLE), or does not fit
  // the target (hidden size, vocabulary, aux layers out of range), naming both sides.
  EagleHead(const std::filesystem::path& dir, EagleKind kind, const LlamaModel& target);
  // An EAGLE-3 head of shape `head` whose tensors (SGLang's names: fc.weight, midlayer.*,
  // norm.weight, lm_head.weight, d2t; embed_tokens.weight if it has its own) come from `weights`,
  // e.g. SyntheticEagle3Weights. The same checks against the target as the folder constructor.
  EagleHead(const Eagle3HeadConfig& head, const WeightSource& weights, const LlamaModel& target);

  EagleKind kind() const { return kind_; }
  const ModelConfig& config() const { return config_; }
  const AttentionLayer& attention_layer() const { return attention_layer_; }
  // What the target must capture for this head (HiddenCapture::layers) and its width per token.
  const std::vector<int>& capture_layers() const { return capture_layers_; }
  int feature_size() const { return feature_size_; }
  int hidden_size() const { return config_.hidden_size; }
  int draft_vocab_size() const { return draft_vocab_; }
  // Target id of a draft-vocabulary id.
  int32_t to_target_id(int32_t draft_id) const;
  const EagleWeights& weights() const { return w_; }
  const LlamaModel& target() const { return target_; }
  const std::vector<float>& inv_freq() const { return inv_freq_; }
  float rope_attention_factor() const { return rope_attention_factor_; }

  // Runs the head over the batch's tokens (input_ids, positions, KV slots of its draft KV pool).
  // hidden_in: [num_tokens, feature_size()] target features when from_target, else
  // [num_tokens, hidden_size()] hidden states of earlier draft steps. Writes the next hidden
  // states [num_tokens, hidden] and f32 logits over the draft vocabulary of the rows `logit_rows`
  // ([rows, draft_vocab]). The backend's metadata must be initialised for this batch.
  void forward(const ForwardBatch& batch, AttentionBackend& backend, const float* hidden_in, bool from_target,
               std::vector<float>& hidden_out, const std::vector<int64_t>& logit_rows, std::vector<float>& logits) const;

 private:
  // The parts both constructors share: the embedding (or the check that the target's fits), the
  // EAGLE-3 tensors with their checks against the target, and the attention layer and RoPE.
  void load_embedding(const WeightSource& weights);
  void load_eagle3(const Eagle3HeadConfig& head, const WeightSource& weights);
  void load_layer(const WeightSource& weights, const std::string& prefix, int64_t attn_in);
  void finish();

  EagleKind kind_;
  ModelConfig config_;
  const LlamaModel& target_;
  int feature_size_ = 0;
  int draft_vocab_ = 0;
  std::vector<int> capture_layers_;
  AttentionLayer attention_layer_;
  std::vector<float> inv_freq_;
  float rope_attention_factor_ = 1.0f;
  EagleWeights w_;
};

}  // namespace specula
