// Ceiling measurements: best of a few repetitions, after a warm-up that faults the pages in.
#include "specula/cli/cpu_ceilings.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <vector>

#include "specula/core/thread_pool.h"

namespace specula {

namespace {
double seconds_of(const auto& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}
}  // namespace

CpuCeilings measure_cpu_ceilings(ThreadPool& pool) {
  CpuCeilings c;
  // 512 MiB each way: far beyond any cache.
  const size_t bytes = size_t{512} << 20;
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  const int64_t chunks = 64;
  const size_t chunk = bytes / chunks;
  auto copy_all = [&] {
    pool.parallel_for(chunks, [&](int64_t i, int) {
      std::memcpy(dst.data() + static_cast<size_t>(i) * chunk, src.data() + static_cast<size_t>(i) * chunk, chunk);
    });
  };
  copy_all();
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) best = std::min(best, seconds_of(copy_all));
  c.copy_gbps = 2.0 * static_cast<double>(bytes) / best / 1e9;

  const int n = 1536;
  std::vector<float> a(static_cast<size_t>(n) * n), b(a.size()), out(a.size());
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (float& x : a) x = dist(rng);
  for (float& x : b) x = dist(rng);
  openblas_set_num_threads(pool.num_threads());
  auto gemm = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, out.data(), n);
  };
  gemm();
  best = 1e30;
  for (int rep = 0; rep < 3; ++rep) best = std::min(best, seconds_of(gemm));
  c.sgemm_gflops = 2.0 * n * n * static_cast<double>(n) / best / 1e9;
  return c;
}

}  // namespace specula
