// Tiny random-weight checkpoints in Hugging Face layout for the model tests: named f32 tensors
// drawn from normal distributions, written as config.json + model.safetensors (+ the shipped
// byte-level tokenizer).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

namespace specula::test {

struct TinyWeights {
  std::map<std::string, std::vector<float>> values;
  std::map<std::string, std::vector<int64_t>> shapes;

  // A tensor of normal(mean, scale) values.
  void add(std::mt19937& rng, const std::string& name, std::vector<int64_t> dims, float scale, float mean = 0);
  const std::vector<float>& at(const std::string& name) const { return values.at(name); }
};

// Writes dir/config.json, dir/model.safetensors (F32) and dir/tokenizer.json (the shipped model's).
void write_tiny_checkpoint(const std::filesystem::path& dir, const nlohmann::json& config, const TinyWeights& weights);

}  // namespace specula::test
