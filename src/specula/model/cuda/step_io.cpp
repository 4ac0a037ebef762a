// GPU decoder plumbing.
#include "specula/model/cuda/step_io.h"

#include <algorithm>

#include "specula/core/cuda_check.h"
#include "specula/core/error.h"
#include "specula/model/cuda/argmax.h"

namespace specula {

void* create_model_stream(Device device, bool nonblocking) {
  CUDA_CHECK(cudaSetDevice(device.index));
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, nonblocking ? cudaStreamNonBlocking : cudaStreamDefault));
  return stream;
}

void upload_i32_async(Buffer& dst, const std::vector<int32_t>& src, cudaStream_t s) {
  CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), src.size() * sizeof(int32_t), cudaMemcpyHostToDevice, s));
}

void upload_f32_async(Buffer& dst, const std::vector<float>& src, cudaStream_t s) {
  CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), src.size() * sizeof(float), cudaMemcpyHostToDevice, s));
}

void upload_ids_async(Buffer& dst, const ForwardBatch& batch, int requests, cudaStream_t s) {
  upload_i32_async(dst, batch.input_ids, s);
  const SpecInfo* info = batch.spec_info.get();
  if (info == nullptr || info->device_tree_tokens == nullptr || requests == 0) return;
  const int N = info->num_draft_tokens;
  SPECULA_CHECK(batch.forward_mode == ForwardMode::TARGET_VERIFY && N >= 2 &&
                    batch.input_ids.size() >= static_cast<size_t>(requests) * static_cast<size_t>(N) &&
                    info->device_tree_pitch >= N - 1,
                "device tree tokens need a TARGET_VERIFY batch of {} tokens per request and a pitch >= {}, not {}", N,
                N - 1, info->device_tree_pitch);
  constexpr size_t kId = sizeof(int32_t);
  CUDA_CHECK(cudaMemcpy2DAsync(dst.data_as<int32_t>() + 1, static_cast<size_t>(N) * kId, info->device_tree_tokens,
                               static_cast<size_t>(info->device_tree_pitch) * kId, static_cast<size_t>(N - 1) * kId,
                               static_cast<size_t>(requests), cudaMemcpyDeviceToDevice, s));
}

std::vector<int32_t> logit_rows(const ForwardBatch& batch, bool all_tokens) {
  std::vector<int32_t> rows;
  if (all_tokens || batch.num_tokens() == batch.batch_size) return rows;
  int32_t end = 0;
  for (int r = 0; r < batch.batch_size; ++r) {
    end += batch.query_len(r);
    rows.push_back(end - 1);
  }
  return rows;
}

namespace {

// The rows' allowed tokens on the device (filled on the host as the step runs), or null.
const uint32_t* upload_token_bitmask(const TokenBitmaskFill& fill, GreedyBuffers& greedy, int64_t rows, int vocab,
                                     Device device, cudaStream_t s) {
  if (!fill) return nullptr;
  const auto words = static_cast<size_t>(rows) * static_cast<size_t>((vocab + 31) / 32);
  auto* host = greedy.mask_host.reserve_as<uint32_t>(words);
  fill(std::span<uint32_t>(host, words));
  if (greedy.mask_device.data() == nullptr || greedy.mask_device.numel() < static_cast<int64_t>(words)) {
    greedy.mask_device = Buffer(DType::i32, {static_cast<int64_t>(words)}, device);
  }
  CUDA_CHECK(cudaMemcpyAsync(greedy.mask_device.data(), host, words * sizeof(uint32_t), cudaMemcpyHostToDevice, s));
  return static_cast<const uint32_t*>(greedy.mask_device.data());
}

}  // namespace

void download_step(PinnedBuffer& pinned, const float* src, int64_t rows, int vocab, std::vector<float>& logits,
                   std::vector<int32_t>* greedy_ids,
                   const TokenBitmaskFill& token_bitmask, const std::function<void()>& host_work, GreedyBuffers& greedy,
                   HiddenCapture* capture, const float* captured_states,
                   Device device, cudaStream_t s, const std::function<void()>& before_wait, cudaEvent_t done,
                   const GreedyCombine& combine) {
  const size_t captured = capture != nullptr ? capture->data.size() : 0;
  const auto count = static_cast<size_t>(rows) * static_cast<size_t>(greedy_ids != nullptr ? 1 : vocab);
  const size_t item = greedy_ids != nullptr ? sizeof(int32_t) : sizeof(float);
  auto* host = static_cast<unsigned char*>(pinned.reserve(captured * sizeof(float) + count * item));
  if (captured > 0) {
    CUDA_CHECK(cudaMemcpyAsync(host, captured_states, captured * sizeof(float), cudaMemcpyDeviceToHost, s));
  }
  const void* results = src;
  if (greedy_ids != nullptr) {
    Buffer& ids = greedy.ids;
    if (ids.data() == nullptr || ids.numel() < rows) ids = Buffer(DType::i32, {std::max<int64_t>(rows, 1)}, device);
    const uint32_t* allowed = upload_token_bitmask(token_bitmask, greedy, rows, vocab, device, s);
    // The combine compares the rows' best logits too.
    Buffer& vals = greedy.values;
    if (combine && (vals.data() == nullptr || vals.numel() < rows)) {
      vals = Buffer(DType::f32, {std::max<int64_t>(rows, 1)}, device);
    }
    cuda_kernels::argmax_rows(src, rows, vocab, ids.data_as<int32_t>(), s, allowed,
                              combine ? vals.data_as<float>() : nullptr);
    if (combine) combine(ids.data_as<int32_t>(), vals.data_as<float>(), rows);
    results = ids.data();
  }
  CUDA_CHECK(cudaMemcpyAsync(host + captured * sizeof(float), results, count * item, cudaMemcpyDeviceToHost, s));
  if (before_wait || host_work) {
    SPECULA_CHECK(done != nullptr, "download_step: work done before the wait needs an event to wait on");
    CUDA_CHECK(cudaEventRecord(done, s));
    try {
      if (before_wait) before_wait();
      if (host_work) host_work();
    } catch (...) {
      // The downloads into pinned memory are still in flight: the next step must not reuse it
      // before they land.
      cudaEventSynchronize(done);
      throw;
    }
    CUDA_CHECK(cudaEventSynchronize(done));
  } else {
    CUDA_CHECK(cudaStreamSynchronize(s));
  }
  if (captured > 0) std::copy_n(reinterpret_cast<const float*>(host), captured, capture->data.begin());
  if (greedy_ids != nullptr) {
    const auto* first = reinterpret_cast<const int32_t*>(host + captured * sizeof(float));
    greedy_ids->assign(first, first + count);
  } else {
    const auto* first = reinterpret_cast<const float*>(host + captured * sizeof(float));
    logits.assign(first, first + count);
  }
}

}  // namespace specula
