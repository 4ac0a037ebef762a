// F32WeightLoader: conversion and the progress line.
#include "specula/model/weight_loader.h"

#include <unistd.h>

#include <cstdio>

namespace specula {

// Only on a terminal and only past 256 MiB: small models load in a blink and logs should not
// fill with carriage returns.
F32WeightLoader::F32WeightLoader(const WeightSource& source)
    : source_(source), total_(source.total_bytes()), show_(total_ > (size_t{256} << 20) && isatty(2) != 0) {}

F32WeightLoader::~F32WeightLoader() {
  if (show_) std::fprintf(stderr, "\rloading weights 100%% (%.2f GB)\n", static_cast<double>(total_) / 1e9);
}

std::vector<float> F32WeightLoader::operator()(const std::string& name, const Shape& shape) {
  const TensorView t = source_.get(name, shape);
  std::vector<float> out(static_cast<size_t>(t.numel()));
  convert_to_float(t.data(), t.dtype(), out.data(), out.size());
  done_ += t.nbytes();
  const int percent = static_cast<int>(100.0 * static_cast<double>(done_) / static_cast<double>(total_));
  if (show_ && percent != last_percent_) {
    last_percent_ = percent;
    std::fprintf(stderr, "\rloading weights %3d%% (%.2f / %.2f GB)", percent, static_cast<double>(done_) / 1e9,
                 static_cast<double>(total_) / 1e9);
    std::fflush(stderr);
  }
  return out;
}

}  // namespace specula
