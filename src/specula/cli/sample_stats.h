// The summary the benchmarks print for a set of samples (latencies, mask times): mean, median,
// nearest-rank p99 and max.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace specula {

struct SampleStats {
  size_t n = 0;
  double mean = 0, median = 0, p99 = 0, max = 0;
};

inline SampleStats summarize(std::vector<double> v) {
  SampleStats s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.n = v.size();
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / static_cast<double>(v.size());
  s.median = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  // Nearest-rank percentile.
  const auto rank = static_cast<size_t>(std::ceil(0.99 * static_cast<double>(v.size())));
  s.p99 = v[std::max<size_t>(rank, 1) - 1];
  s.max = v.back();
  return s;
}

}  // namespace specula
