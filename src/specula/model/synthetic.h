// Synthetic models for benchmarks: the config of a named real model shape and random bf16
// weights of that shape, made on demand (nothing is read from disk).
#pragma once

#include <string>
#include <vector>

#include "specula/model/config.h"
#include "specula/model/weights.h"

namespace specula {

// "llama3-8b" (Llama-3-8B), "llama3.2-1b" (Llama-3.2-1B), "deepseek-v2-lite-dense" (DeepSeek-V2-Lite
// with dense MLPs), "tiny" (the shipped model's shape).
ModelConfig synthetic_config(const std::string& name);
std::vector<std::string> synthetic_names();

class SyntheticWeights final : public WeightSource {
 public:
  SyntheticWeights(const ModelConfig& config, uint64_t seed);
  TensorView get(const std::string& name, const Shape& shape) const override;
  bool contains(const std::string& name) const override;
  size_t total_bytes() const override;

 private:
  ModelConfig config_;
  uint64_t seed_;
  mutable Buffer scratch_;
};

}  // namespace specula
