// UploadBatch: the host staging area, then one copy and the scatter.
#include "specula/core/upload_batch.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "specula/core/cuda_check.h"
#include "specula/core/scatter_bytes.h"

namespace specula {

namespace {
constexpr size_t kAlign = 16;  // scatter_bytes' source offsets
}  // namespace

void UploadBatch::add(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  SPECULA_REQUIRE(bytes <= UINT32_MAX, "UploadBatch: an upload of " + std::to_string(bytes) + " bytes is too large");
  const size_t offset = (host_.size() + kAlign - 1) / kAlign * kAlign;
  host_.resize(offset + bytes);
  std::memcpy(host_.data() + offset, src, bytes);
  entries_.push_back({dst, offset, bytes});
}

void UploadBatch::flush(cudaStream_t s) {
  if (entries_.empty()) return;
  SPECULA_REQUIRE(host_.size() <= UINT32_MAX, "UploadBatch: " + std::to_string(host_.size()) + " bytes staged");
  const auto size = static_cast<int64_t>(host_.size());
  if (staging_.data() == nullptr || staging_.numel() < size) {
    staging_ = Buffer(DType::u8, {std::max<int64_t>(size, 4096)}, device_);
  }
  // From pageable memory: the call returns once the bytes are staged, so host_ may be reused.
  CUDA_CHECK(cudaMemcpyAsync(staging_.data(), host_.data(), host_.size(), cudaMemcpyHostToDevice, s));
  namespace ck = cuda_kernels;
  for (size_t first = 0; first < entries_.size(); first += ck::kScatterMax) {
    ck::ScatterParams p{};
    p.src = staging_.data_as<const unsigned char>();
    p.count = static_cast<int>(std::min<size_t>(ck::kScatterMax, entries_.size() - first));
    for (int i = 0; i < p.count; ++i) {
      const Entry& e = entries_[first + static_cast<size_t>(i)];
      p.dst[i] = static_cast<unsigned char*>(e.dst);
      p.offset[i] = static_cast<uint32_t>(e.offset);
      p.bytes[i] = static_cast<uint32_t>(e.bytes);
    }
    ck::scatter_bytes(p, s);
  }
  host_.clear();
  entries_.clear();
}

}  // namespace specula
