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
  // Tensors written as F8_E4M3 codes instead of their (dequantized) values.
  std::map<std::string, std::vector<uint8_t>> fp8_codes;

  // A tensor of normal(mean, scale) values.
  void add(std::mt19937& rng, const std::string& name, std::vector<int64_t> dims, float scale, float mean = 0);
  const std::vector<float>& at(const std::string& name) const { return values.at(name); }
};

// Stores matrix `name` as fp8 e4m3 codes with f32 block scales "<name>_scale_inv" (DeepSeek-V3's
// layout; scale = max |w| / 448 over each [block_out, block_in] block) and replaces its values by
// the dequantized ones as DeepSeek's weight_dequant gives them (code x scale in f32, rounded to
// bf16; decoded and rounded here, not by the library), which the references then use.
void quantize_fp8_blocks(TinyWeights& w, const std::string& name, int block_out, int block_in);

float round_bf16(float v);

// e4m3 code -> value (sign, 4 exponent bits with bias 7, 3 mantissa bits; 0x7f / 0xff NaN).
double decode_e4m3(uint8_t code);

// Writes dir/config.json, dir/model.safetensors (F32, and F8_E4M3 for fp8_codes) and
// dir/tokenizer.json (the shipped model's).
void write_tiny_checkpoint(const std::filesystem::path& dir, const nlohmann::json& config, const TinyWeights& weights);

}  // namespace specula::test
