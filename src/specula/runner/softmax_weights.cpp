#include "specula/runner/softmax_weights.h"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace specula {

// On x86-64, an AVX2 copy (glibc's 8-wide vector exp) beside the baseline one, chosen at load
// time.
#if defined(__x86_64__)
#define SPECULA_SOFTMAX_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define SPECULA_SOFTMAX_CLONES
#endif
SPECULA_SOFTMAX_CLONES double softmax_weights(std::span<const float> x, float top, float temperature,
                                              std::span<float> w, std::vector<double>* block_sums) {
  const float inv = 1.0f / temperature;
  const size_t n = x.size();
  const float* in = x.data();
  float* out = w.data();
  // This file is built with -ffast-math (so that exp vectorises); it assumes no infinities, so
  // -inf logits never reach exp. glibc's vector expf has a fast path for |x| <= 87.3 only: one lane
  // outside sends the whole vector down its scalar path, which made a grammar's masked row (mostly
  // -inf) ten times slower to draw from. So exp sees at least kFast, lanes below it get 0, and the
  // rare lanes whose exp is a denormal (between kZero and kFast) are redone one by one: the same
  // weights as exp over every lane gives, at the fast path's speed.
  constexpr float kFast = -87.0f;
  constexpr float kZero = -104.0f;  // expf is 0 below: its smallest denormal is e^-103.3
  int denormal = 0;
  for (size_t i = 0; i < n; ++i) {
    const float y = (in[i] - top) * inv;
    const bool fast = y >= kFast;
    const float e = std::exp(fast ? y : kFast);
    out[i] = fast ? e : 0.0f;
    denormal |= static_cast<int>(!fast && y > kZero);
  }
  if (denormal != 0) {
    for (size_t i = 0; i < n; ++i) {
      const float y = (in[i] - top) * inv;
      if (y < kFast && y > kZero) out[i] = std::exp(y);
    }
  }
  // Blocks of float sums, added up in double: the total keeps double's range and most of its
  // accuracy, and the inner loop still vectorises.
  double sum = 0.0;
  if (block_sums != nullptr) block_sums->clear();
  for (size_t b = 0; b < n; b += kSoftmaxBlock) {
    float part = 0.0f;
    const size_t end = b + kSoftmaxBlock < n ? b + kSoftmaxBlock : n;
    for (size_t i = b; i < end; ++i) part += out[i];
    sum += part;
    if (block_sums != nullptr) block_sums->push_back(part);
  }
  return sum;
}

float row_max(std::span<const float> x) {
  // Comparisons only: an -inf entry takes part as itself.
  float top = x.empty() ? 0.0f : x[0];
  for (float v : x) top = v > top ? v : top;
  return top;
}

RowValues row_values(std::span<const float> x) {
  // Bit tests (this file assumes no infinities in arithmetic): an exponent of all ones is an
  // infinity or a NaN, and -inf is the one such pattern a row may hold as it is.
  uint32_t odd = 0, finite = 0;
  for (float v : x) {
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    const uint32_t special = static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
    odd |= special & static_cast<uint32_t>(bits != 0xff800000u);
    finite |= special ^ 1u;
  }
  return {odd == 0, finite != 0};
}

}  // namespace specula
