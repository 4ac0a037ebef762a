// F32WeightLoader: reads a model's tensors from a WeightSource as f32 (the CPU decoders hold their
// weights so), showing a progress line on a terminal while large checkpoints convert.
#pragma once

#include <string>
#include <vector>

#include "specula/model/weights.h"

namespace specula {

class F32WeightLoader {
 public:
  explicit F32WeightLoader(const WeightSource& source);
  ~F32WeightLoader();
  F32WeightLoader(const F32WeightLoader&) = delete;
  F32WeightLoader& operator=(const F32WeightLoader&) = delete;

  // The tensor `name` of exactly `shape` as f32; throws specula::Error otherwise.
  std::vector<float> operator()(const std::string& name, const Shape& shape);

 private:
  const WeightSource& source_;
  size_t total_;
  size_t done_ = 0;
  int last_percent_ = -1;
  bool show_;
};

}  // namespace specula
