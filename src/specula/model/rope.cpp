// Rope frequency formulas, following transformers' modeling_rope_utils.
#include "specula/model/rope.h"

#include <algorithm>
#include <cmath>

#include "specula/core/error.h"

namespace specula {

namespace {

std::vector<float> default_inv_freq(double base, int dim) {
  std::vector<float> f(static_cast<size_t>(dim / 2));
  for (int i = 0; i < dim / 2; ++i) {
    // In f32, as Hugging Face computes it, so positions map to the same angles.
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    f[static_cast<size_t>(i)] = 1.0f / std::pow(static_cast<float>(base), exponent);
  }
  return f;
}

// Long wavelengths divided by factor, short ones kept, the band between blended.
void llama3(std::vector<float>& inv_freq, const RopeScaling& s) {
  const double low_wavelen = s.original_max_position_embeddings / s.low_freq_factor;
  const double high_wavelen = s.original_max_position_embeddings / s.high_freq_factor;
  for (float& f : inv_freq) {
    const double wavelen = 2.0 * M_PI / f;
    if (wavelen > low_wavelen) {
      f = static_cast<float>(f / s.factor);
    } else if (wavelen >= high_wavelen) {
      const double smooth =
          (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      f = static_cast<float>((1.0 - smooth) * f / s.factor + smooth * f);
    }
  }
}

// YaRN: dimensions rotating fast enough (more than beta_fast turns over the original context)
// keep their frequency, slow ones are interpolated by factor, a linear ramp between.
RopeFrequencies yarn(const ModelConfig& c) {
  const RopeScaling& s = c.rope_scaling;
  const int dim = c.head_dim;
  const double base = c.rope_theta;
  const double original = s.original_max_position_embeddings > 0 ? s.original_max_position_embeddings
                                                                   : c.max_position_embeddings;
  auto correction_dim = [&](double rotations) {
    return dim * std::log(original / (rotations * 2.0 * M_PI)) / (2.0 * std::log(base));
  };
  double low = correction_dim(s.beta_fast);
  double high = correction_dim(s.beta_slow);
  if (s.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // avoids a division by zero in the ramp
  RopeFrequencies r;
  r.inv_freq.resize(static_cast<size_t>(dim / 2));
  for (int i = 0; i < dim / 2; ++i) {
    const double pos_freq = std::pow(base, static_cast<double>(2 * i) / dim);
    const double extrapolation = 1.0 / pos_freq, interpolation = 1.0 / (s.factor * pos_freq);
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double keep = 1.0 - ramp;  // share of the original (extrapolated) frequency
    r.inv_freq[static_cast<size_t>(i)] = static_cast<float>(interpolation * (1.0 - keep) + extrapolation * keep);
  }
  double factor = s.attention_factor;
  if (factor <= 0) {
    // DeepSeek's configs give both mscales; the part the softmax scale does not take scales cos/sin.
    factor = s.mscale != 0 && s.mscale_all_dim != 0
                 ? yarn_get_mscale(s.factor, s.mscale) / yarn_get_mscale(s.factor, s.mscale_all_dim)
                 : yarn_get_mscale(s.factor, 1.0);
  }
  r.attention_factor = static_cast<float>(factor);
  return r;
}

}  // namespace

double yarn_get_mscale(double factor, double mscale) { return factor <= 1 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0; }

RopeFrequencies compute_rope_frequencies(const ModelConfig& c) {
  const RopeScaling& s = c.rope_scaling;
  if (s.type == "yarn") return yarn(c);
  RopeFrequencies r;
  if (s.type == "dynamic") {
    // NTK-aware base for the longest context the model supports (factor x max positions).
    const double max_len = c.max_position_embeddings * s.factor;
    const double base = c.rope_theta * std::pow(s.factor * max_len / c.max_position_embeddings - (s.factor - 1.0),
                                                static_cast<double>(c.head_dim) / (c.head_dim - 2));
    r.inv_freq = default_inv_freq(base, c.head_dim);
    return r;
  }
  r.inv_freq = default_inv_freq(c.rope_theta, c.head_dim);
  if (s.type == "linear") {
    for (float& f : r.inv_freq) f = static_cast<float>(f / s.factor);
  } else if (s.type == "llama3") {
    llama3(r.inv_freq, s);
  } else {
    SPECULA_CHECK(s.type == "default", "rope scaling type '{}' is not supported", s.type);
  }
  return r;
}

}  // namespace specula
