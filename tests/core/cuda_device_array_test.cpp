// specula::DeviceArray (core/device_array.h), the step-state arrays of both CUDA attention
// backends: uploads through an UploadBatch land exactly, growth keeps at least the asked size,
// reserve_zeroed zeroes what it allocates, a frozen array keeps its storage and refuses to grow
// with a message naming both sizes, and view() describes the first entries. Skipped where no GPU
// is visible.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_support.h"
#include "specula/core/cuda_check.h"
#include "specula/core/device.h"
#include "specula/core/device_array.h"
#include "specula/core/error.h"
#include "specula/core/upload_batch.h"

namespace specula::testing {
namespace {

template <typename T>
std::vector<T> download(const specula::DeviceArray<T>& a, int64_t n) {
  std::vector<T> host(static_cast<size_t>(n));
  CUDA_CHECK(cudaMemcpy(host.data(), a.data(), host.size() * sizeof(T), cudaMemcpyDeviceToHost));
  return host;
}

TEST(CudaDeviceArray, UploadsGrowZeroAndFreeze) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(test_seed("cuda_core_test"));
  const Device dev = Device::cuda(0);
  cudaStream_t s = nullptr;
  CUDA_CHECK(cudaStreamCreate(&s));
  UploadBatch batch(dev);

  // Two uploads of growing random lengths: each lands whole, and the second one's larger size
  // moves the array to new storage.
  specula::DeviceArray<int32_t> ints;
  specula::DeviceArray<uint64_t> words;
  for (int round = 0; round < 2; ++round) {
    std::vector<int32_t> a(static_cast<size_t>(100 + 900 * round + rng() % 50));
    std::vector<uint64_t> b(static_cast<size_t>(7 + rng() % 20));
    for (auto& x : a) x = static_cast<int32_t>(rng() | 1u);
    for (auto& x : b) x = rng() | 1u;
    ints.upload(a, dev, batch);
    words.upload(b, dev, batch);
    batch.flush(s);
    CUDA_CHECK(cudaStreamSynchronize(s));
    EXPECT_EQ(download(ints, static_cast<int64_t>(a.size())), a) << "round " << round;
    EXPECT_EQ(download(words, static_cast<int64_t>(b.size())), b) << "round " << round;
  }

  // Growth by reserve_zeroed: the new storage reads zero, whatever the old one held.
  specula::DeviceArray<float> f;
  std::vector<float> junk(64);
  for (auto& x : junk) x = std::uniform_real_distribution<float>(0.5f, 2.0f)(rng);
  f.upload(junk, dev, batch);
  batch.flush(s);
  const int64_t grown = 5000 + static_cast<int64_t>(rng() % 1000);
  f.reserve_zeroed(grown, dev, s);
  CUDA_CHECK(cudaStreamSynchronize(s));
  for (float x : download(f, grown)) ASSERT_EQ(x, 0.0f);

  // Frozen: asks within the capacity keep the storage (what captured graphs point at); a larger
  // one is refused and names both sizes.
  f.freeze();
  const float* before = f.data();
  f.reserve(grown, dev);
  f.reserve(1, dev);
  EXPECT_EQ(f.data(), before);
  try {
    f.reserve(grown + 1, dev);
    FAIL() << "a frozen array grew";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(std::to_string(grown + 1)), std::string::npos) << what;
    EXPECT_NE(what.find(std::to_string(grown)), std::string::npos) << what;
  }
  EXPECT_EQ(f.data(), before);

  // view(n): the first n entries, as a tensor of the array's dtype.
  const TensorView v = ints.view(17);
  EXPECT_EQ(v.data(), static_cast<void*>(ints.data()));
  EXPECT_EQ(v.dtype(), DType::i32);
  ASSERT_EQ(v.rank(), 1);
  EXPECT_EQ(v.size(0), 17);
  CUDA_CHECK(cudaStreamDestroy(s));
}

}  // namespace
}  // namespace specula::testing
