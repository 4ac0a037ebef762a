// Host/device plumbing shared by the GPU decoders (LlamaCudaModel, DeepseekCudaModel): their
// stream, the per-step uploads of ids, positions and row lists, which rows' logits a step
// returns, and the step's download (logits, or greedy ids found on the device).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "specula/batch/forward_batch.h"
#include "specula/core/pinned_buffer.h"
#include "specula/core/tensor.h"
#include "specula/model/hidden_capture.h"
#include "specula/model/model.h"

namespace specula {

// A blocking stream on device: it stays ordered with core/'s synchronous copies (legacy stream).
// nonblocking: a stream the legacy stream does not wait for (tensor-parallel ranks sharing one GPU
// in tests, where a legacy-stream copy would otherwise wait behind another rank's spinning
// all-reduce); results are still read through the stream and its sync.
void* create_model_stream(Device device, bool nonblocking = false);
// dst[0, src.size()) = src on stream s. From pageable memory the call returns once the data is
// staged, so src may go away after.
void upload_i32_async(Buffer& dst, const std::vector<int32_t>& src, cudaStream_t s);
void upload_f32_async(Buffer& dst, const std::vector<float>& src, cudaStream_t s);
// A step's token ids: batch.input_ids, then, for a TARGET_VERIFY batch whose tree tokens are on
// the device (SpecInfo::device_tree_tokens), those of its first `requests` requests copied over
// the placeholders on the device.
void upload_ids_async(Buffer& dst, const ForwardBatch& batch, int requests, cudaStream_t s);
// The token rows whose logits a step returns: each request's last token, or every token with
// all_tokens. Empty when that is every token of the batch in order (all_tokens, or a decode step).
std::vector<int32_t> logit_rows(const ForwardBatch& batch, bool all_tokens);

// Where a step's greedy tokens are found on the device: their device buffer, and structured
// output's allowed-token masks (pinned host words the fill writes, their device copy); all grown
// as steps need.
struct GreedyBuffers {
  Buffer ids;
  Buffer values;  // each row's greedy logit, for tensor parallelism's combine
  PinnedBuffer mask_host;
  Buffer mask_device;
};

// A step's results to the host through pinned memory, with one sync: with capture, the first
// capture->data.size() floats of captured_states into capture->data; then the rows x vocab
// logits at src into logits or, with greedy_ids, only each row's greedy token, found on the
// device (cuda_kernels::argmax_rows into greedy.ids): 4 bytes per row cross instead of the
// vocabulary's logits and the host does not scan them. token_bitmask (optional, with
// greedy_ids): the rows' allowed tokens, filled here while the device still runs the queued
// step, then uploaded before the argmax. host_work (optional): ForwardRequest::host_work, run while
// the device runs the step (`done` must then be given).
// before_wait (optional): called once the downloads are queued, with `done` recorded after them;
// the work it queues on s runs while the host waits only for `done`.
// combine (optional, with greedy_ids): queued on s after the device argmax, over the device ids and
// values of the rows, before anything reads them (tensor parallelism: the ranks' parts combined).
using GreedyCombine = std::function<void(int32_t* ids, float* values, int64_t rows)>;
void download_step(PinnedBuffer& pinned, const float* src, int64_t rows, int vocab, std::vector<float>& logits,
                   std::vector<int32_t>* greedy_ids,
                   const TokenBitmaskFill& token_bitmask, const std::function<void()>& host_work, GreedyBuffers& greedy,
                   HiddenCapture* capture, const float* captured_states,
                   Device device, cudaStream_t s, const std::function<void()>& before_wait = {},
                   cudaEvent_t done = nullptr, const GreedyCombine& combine = {});

}  // namespace specula
