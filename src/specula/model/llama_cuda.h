// LlamaCudaModel: the same decoder as LlamaModel, executed on a CUDA device. Weight matrices are
// held in bf16 when the checkpoint's values are bf16 (else f32); activations are f32. Products:
// a bf16 GEMV kernel for up to 8 rows (decode), two bf16 tensor-core GEMMs over a hi/lo split of
// the activations for more rows (or GEMV passes of 8 rows in deterministic mode), cuBLAS sgemm for f32 weights; the element-wise kernels of
// model/cuda and the fused ones (q/k/v epilogue, gated activation, add + RMSNorm); bf16 q/k/v
// through the CUDA attention backend over a bf16 paged KV cache.
// Everything runs on the model's own stream; DECODE steps can run as CUDA graphs captured per
// batch size (SGLang's CudaGraphRunner), padded up to the next captured size.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "specula/attention/backend.h"
#include "specula/core/pinned_buffer.h"
#include "specula/core/tensor.h"
#include "specula/model/cuda/decode_graphs.h"
#include "specula/model/cuda/decoder_layer.h"
#include "specula/model/cuda/decoder_ends.h"
#include "specula/model/cuda/workspace.h"
#include "specula/model/llama.h"

namespace specula {

class CudaGraph;
class CudaLinear;

class LlamaCudaModel {
 public:
  // Uploads the host model's weights. deterministic: every product row is computed the same way
  // whatever the number of rows (the GEMV kernel, 8 rows per pass), so a request's results do not
  // depend on its batch; slower for prefill.
  LlamaCudaModel(const LlamaModel& host, Device device, bool deterministic = false);
  ~LlamaCudaModel();
  LlamaCudaModel(const LlamaCudaModel&) = delete;
  LlamaCudaModel& operator=(const LlamaCudaModel&) = delete;

  // The cudaStream_t all of the model's work runs on; the attention backend must use it too.
  void* stream() const { return stream_; }
  // Bytes of weights as held on the device (what one decode step reads).
  size_t weight_bytes() const;

  // As LlamaModel::forward; logits (and captured hidden states) come back to the host. With
  // greedy_ids, only each returned row's greedy token does, found on the device (download_step in
  // model/cuda/step_io.h), and logits is left as it was. The same for the graph paths below.
  void forward(const ForwardBatch& batch, AttentionBackend& backend, std::vector<float>& logits, bool all_tokens = false,
               HiddenCapture* capture = nullptr, std::vector<int32_t>* greedy_ids = nullptr);

  // Captures one DECODE-step graph per batch size. The backend must have had
  // init_cuda_graph_state(max size). Padding rows (capture, and batches smaller than their
  // graph) are one-token requests of token id 0 at position 0 in request row padding_req_row,
  // whose token 0 is KV slot padding_slot (a page set aside for them).
  void capture_decode_graphs(AttentionBackend& backend, std::vector<int> batch_sizes, int32_t padding_req_row,
                             int32_t padding_slot, ReqToTokenPool* req_pool, MHAKVPool* kv_pool);
  // Runs a DECODE batch through the smallest captured graph that holds it; false (nothing run)
  // when there is none, and the caller runs forward().
  bool forward_decode_graph(const ForwardBatch& batch, AttentionBackend& backend, std::vector<float>& logits,
                            std::vector<int32_t>* greedy_ids = nullptr);
  std::vector<int> graph_batch_sizes() const;

  // TARGET_VERIFY graphs for speculative decoding (SGLang captures them in the same runner): one
  // per batch size for requests of num_draft_tokens tree tokens each, giving the logits of every
  // token and the hidden states of capture_layers (HiddenCapture::layers). The backend must have
  // had init_cuda_graph_state with room for max size x num_draft_tokens tokens. Padding requests
  // have seq_len 1 in padding_req_row, whose positions [0, num_draft_tokens] the caller mapped to
  // slots set aside for them.
  void capture_verify_graphs(AttentionBackend& backend, std::vector<int> batch_sizes, int num_draft_tokens,
                             std::vector<int> capture_layers, int32_t padding_req_row, ReqToTokenPool* req_pool,
                             MHAKVPool* kv_pool);
  // Runs a TARGET_VERIFY batch (with its tree mask, prefix visible) through the smallest verify graph that holds
  // it: logits of every token and the captured hidden states come back to the host. False
  // (nothing run) when no graph fits or the capture asks for other layers.
  bool forward_verify_graph(const ForwardBatch& batch, AttentionBackend& backend, std::vector<float>& logits,
                            HiddenCapture* capture, std::vector<int32_t>* greedy_ids = nullptr);

 private:
  enum Slot : size_t { kIds, kPositions, kX, kXn, kCaptured, kCacheLoc, kRowIds, kSelected, kLogits, kNumSlots };
  using Workspace = CudaStepWorkspace<kNumSlots>;
  Buffer& scratch(Workspace& ws, Slot slot, DType dtype, int64_t elements);
  CudaStepLinear step_linear(Workspace& ws) const;
  // The decoder layers over n tokens whose ids and positions are in kIds and kPositions; the final
  // hidden states are left in kX.
  void run_layers(const ForwardBatch& batch, AttentionBackend& backend, Workspace& ws, int64_t n,
                  HiddenCapture* capture = nullptr);
  // Final norm and lm_head over `count` rows of kX (row ids in device memory, or the first
  // `count` rows when nullptr); returns the f32 logits in kLogits.
  float* run_head(Workspace& ws, const int32_t* row_ids, int64_t count);
  ForwardBatch verify_padding_batch(int batch_size) const;
  // The batch's SpecInfo::on_device_results over ws's ids and captured states and the step's
  // greedy ids, for download_step; empty when the batch has none or the step returns no greedy
  // ids or captured states.
  std::function<void()> results_hook(const ForwardBatch& batch, const Workspace& ws,
                                     const std::vector<int32_t>* greedy_ids, const HiddenCapture* capture);

  const LlamaModel& host_;
  Device device_;
  bool deterministic_;
  void* stream_ = nullptr;  // cudaStream_t
  void* results_event_ = nullptr;  // cudaEvent_t: a step's downloads done (download_step)
  std::unique_ptr<CudaLinear> linear_;
  PinnedBuffer pinned_;  // logits and captured states on their way to the host
  Buffer greedy_dev_;    // the device's greedy tokens of a step (download_step)
  std::unique_ptr<CudaDecoderEnds> ends_;
  std::vector<CudaDecoderLayer> layers_;
  Workspace eager_;
  Workspace graph_ws_;
  DecodeGraphs graphs_;
  Workspace verify_ws_;
  CudaGraphSet verify_graphs_;
  int verify_tokens_ = 0;
  std::vector<int> verify_capture_layers_;
  int32_t verify_padding_row_ = -1;
  ReqToTokenPool* verify_req_pool_ = nullptr;
  MHAKVPool* verify_kv_pool_ = nullptr;
};

}  // namespace specula
