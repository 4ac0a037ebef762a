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
  // The part [begin, end) along dimension `dim` (0 or the last) of tensor `name`, whose whole
  // shape is `shape`, into out (made here: host memory, the tensor's dtype, the part's shape).
  // Tensor parallelism reads each rank's slice so. The default reads the whole tensor through get
  // and copies the part (from a memory-mapped checkpoint only the part's pages are touched);
  // SyntheticWeights makes only the part. Not safe to call concurrently with get on sources whose
  // views are shared scratch.
  virtual void read_slice(const std::string& name, const Shape& shape, int dim, int64_t begin, int64_t end,
                          Buffer& out) const;
};

// Copies part [begin, end) along dim (0 or the last) of the contiguous tensor t into out.
void copy_slice(const TensorView& t, int dim, int64_t begin, int64_t end, Buffer& out);

}  // namespace specula
