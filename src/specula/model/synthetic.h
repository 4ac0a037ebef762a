// Synthetic models for benchmarks: the config of a named real model shape and random bf16
// weights of that shape, made on demand (nothing is read from disk); likewise an EAGLE-3 draft
// head for such a target.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "specula/model/config.h"
#include "specula/model/eagle_head.h"
#include "specula/model/weights.h"

namespace specula {

// "llama3-8b" (Llama-3-8B), "llama3-70b" (Llama-3-70B: 141 GB of bf16, two GPUs with --tp-size 2),
// "llama3.2-1b" (Llama-3.2-1B), "deepseek-v2-lite" (DeepSeek-V2-Lite, 64
// routed + 2 shared experts), "deepseek-v2-lite-dense" (its attention with dense MLPs),
// "qwen3-30b-a3b" (Qwen3-30B-A3B, 128 experts, top 8), "tiny" (the shipped model's shape).
ModelConfig synthetic_config(const std::string& name);
std::vector<std::string> synthetic_names();

class SyntheticWeights final : public WeightSource {
 public:
  SyntheticWeights(const ModelConfig& config, uint64_t seed);
  TensorView get(const std::string& name, const Shape& shape) const override;
  // Makes only the part (the values are those of the whole tensor at the same indices).
  void read_slice(const std::string& name, const Shape& shape, int dim, int64_t begin, int64_t end,
                  Buffer& out) const override;
  bool contains(const std::string& name) const override;
  size_t total_bytes() const override;
  // Of which the routed experts (a GPU model reads those into device memory only).
  size_t routed_expert_bytes() const;

 private:
  ModelConfig config_;
  uint64_t seed_;
  mutable Buffer scratch_;
};

// The EAGLE-3 head of a Llama-family `target` in the published heads' shape (for "llama3-8b" that
// of yuhuili/EAGLE3-LLaMA3.1-Instruct-8B): one decoder layer of the target's layer shape, eps and
// RoPE, q/k/v over 2 x hidden, fc over three captured streams (SGLang's default layers), a draft
// vocabulary of min(32000, vocab / 2) ids, no embedding of its own. Throws specula::Error for an
// MLA target (EagleHead runs over a LlamaModel).
Eagle3HeadConfig synthetic_eagle3_head_config(const ModelConfig& target);

// Random tensors of that head, under SGLang's names and shapes (get checks both, as a Checkpoint
// does): bf16 from SyntheticWeights (norms near 1) and d2t an int64 mapping of the draft ids onto a
// random sorted subset of the target vocabulary (draft id i -> i + d2t[i], all distinct).
class SyntheticEagle3Weights final : public WeightSource {
 public:
  SyntheticEagle3Weights(const Eagle3HeadConfig& head, uint64_t seed);
  TensorView get(const std::string& name, const Shape& shape) const override;
  bool contains(const std::string& name) const override;
  size_t total_bytes() const override;

 private:
  std::map<std::string, Shape> shapes_;
  SyntheticWeights random_;
  Buffer d2t_;
};

}  // namespace specula
