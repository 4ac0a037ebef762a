// Sampler: picks the next token from a row of logits. temperature 0 is greedy (argmax, lowest id
// on ties); otherwise softmax(logits / temperature) restricted by top-k, top-p (nucleus) and
// min-p, drawn from a generator seeded per request so runs are reproducible.
#pragma once

#include <cstdint>
#include <random>
#include <span>

namespace specula {

struct SamplingParams {
  float temperature = 0.0f;
  int top_k = 0;       // 0: no limit
  float top_p = 1.0f;  // 1: no limit
  float min_p = 0.0f;  // 0: no limit
  uint64_t seed = 0;

  // Throws specula::Error naming the bad value.
  void validate() const;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  int32_t sample(std::span<const float> logits);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
};

int32_t argmax(std::span<const float> logits);

}  // namespace specula
