// WeightSource: where a model's tensors come from. A Checkpoint (safetensors on disk) or
// SyntheticWeights (random tensors of a named model shape, for benchmarks).
#pragma once

#include <string>

#include "specula/core/tensor.h"

namespace specula {

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // The tensor `name` with exactly `shape`; throws specula::Error if missing or shaped otherwise.
  // Synthetic sources return a view that stays valid only until the next call.
  virtual TensorView get(const std::string& name, const Shape& shape) const = 0;
  virtual bool contains(const std::string& name) const = 0;
  virtual size_t total_bytes() const = 0;
};

}  // namespace specula
