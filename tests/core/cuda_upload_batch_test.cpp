// UploadBatch against plain host copies: random byte ranges (odd sizes, unaligned destinations,
// more destinations than one scatter launch takes, one over the direct-copy size) land exactly
// where asked, bytes around them
// keep their fill, and batches flushed one after another on a stream (the staging buffer reused
// and grown) each land in order. Skipped where no GPU is visible.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "cuda_test_support.h"
#include "specula/core/cuda_check.h"
#include "specula/core/device.h"
#include "specula/core/upload_batch.h"

namespace specula::testing {
namespace {

TEST(CudaUploadBatch, ScattersEveryRangeInOrder) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(test_seed("cuda_core_test"));
  constexpr size_t kArena = 1 << 20;
  DeviceArray<unsigned char> arena(kArena);
  arena.fill_bytes(0xab);
  std::vector<unsigned char> expect(kArena, 0xab);
  cudaStream_t s = nullptr;
  CUDA_CHECK(cudaStreamCreate(&s));
  UploadBatch batch(Device::cuda(0));
  for (int round = 0; round < 4; ++round) {
    // Disjoint destinations in this round's quarter of the arena, at any byte offset.
    const size_t base = static_cast<size_t>(round) * (kArena / 4);
    size_t at = base + rng() % 16;
    const int count = round == 3 ? 40 : 3 + static_cast<int>(rng() % 20);
    for (int i = 0; i < count; ++i) {
      // Round 1 starts with an array large enough to get a copy of its own.
      const size_t bytes = round == 1 && i == 0 ? 70000 + rng() % 1000 : 1 + rng() % (round == 2 ? 9000 : 700);
      if (at + bytes >= base + kArena / 4) break;
      std::vector<unsigned char> data(bytes);
      for (auto& b : data) b = static_cast<unsigned char>(rng());
      batch.add(arena.get() + at, data.data(), bytes);
      std::memcpy(expect.data() + at, data.data(), bytes);
      // Later writes to the same host vector must not change what was added.
      std::fill(data.begin(), data.end(), 0);
      at += bytes + rng() % 33;
    }
    batch.flush(s);
  }
  // Cleared additions never land.
  std::vector<unsigned char> junk(64, 0x11);
  batch.add(arena.get(), junk.data(), junk.size());
  batch.clear();
  batch.flush(s);
  CUDA_CHECK(cudaStreamSynchronize(s));
  CUDA_CHECK(cudaStreamDestroy(s));
  const std::vector<unsigned char> got = arena.download();
  for (size_t i = 0; i < kArena; ++i) ASSERT_EQ(got[i], expect[i]) << "byte " << i;
}

}  // namespace
}  // namespace specula::testing
