// UploadBatch: the host staging area, then one copy and the scatter.
#include "specula/core/upload_batch.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "specula/core/cuda_check.h"
#include "specula/core/error.h"
#include "specula/core/scatter_bytes.h"

namespace specula {

namespace {
constexpr size_t kAlign = 16;  // scatter_bytes' source offsets
}  // namespace

void UploadBatch::add(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  SPECULA_CHECK(bytes <= UINT32_MAX, "UploadBatch: an upload of {} bytes is too large", bytes);
  const bool direct = bytes > kDirectBytes;
  std::vector<unsigned char>& area = direct ? direct_host_ : host_;
  const size_t offset = (area.size() + kAlign - 1) / kAlign * kAlign;
  area.resize(offset + bytes);
  std::memcpy(area.data() + offset, src, bytes);
  (direct ? direct_ : entries_).push_back({dst, offset, bytes});
}

void UploadBatch::flush(cudaStream_t s) {
  // From pageable memory each copy returns once the bytes are staged, so the areas may be reused.
  for (const Entry& e : direct_) {
    CUDA_CHECK(cudaMemcpyAsync(e.dst, direct_host_.data() + e.offset, e.bytes, cudaMemcpyHostToDevice, s));
  }
  if (!entries_.empty()) {
    const size_t packed = host_.size();
    SPECULA_CHECK(packed <= UINT32_MAX, "UploadBatch: {} bytes staged", packed);
    const auto size = static_cast<int64_t>(packed);
    if (staging_.data() == nullptr || staging_.numel() < size) {
      // Geometric growth: every reallocation frees the old buffer, which synchronises the device.
      staging_ = Buffer(DType::u8, {std::max<int64_t>({size, 2 * staging_.numel(), 4096})}, device_);
    }
    CUDA_CHECK(cudaMemcpyAsync(staging_.data(), host_.data(), packed, cudaMemcpyHostToDevice, s));
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
  }
  clear();
}

}  // namespace specula
