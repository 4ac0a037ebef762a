// CudaDecoderExecutor: the step skeleton every GPU decoder shares (LlamaCudaModel, DeepseekCudaModel),
// written once: the model's stream, its products (CudaLinear), the embedding and logits head
// (CudaDecoderEnds), the step's uploads, the eager step (ids checked, layers, head, download of
// the logits or only the greedy ids) and DECODE-step CUDA graphs captured per batch size and
// replayed padded (SGLang's CudaGraphRunner). A model supplies its layers and its attention
// backend's metadata hooks.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "specula/core/pinned_buffer.h"
#include "specula/core/tensor.h"
#include "specula/model/cpu_decoder.h"
#include "specula/model/cuda/decode_graphs.h"
#include "specula/model/cuda/decoder_ends.h"
#include "specula/model/cuda/decoder_layer.h"
#include "specula/model/cuda/step_io.h"
#include "specula/model/model.h"

namespace specula {

class CudaLinear;
class TpComm;

class CudaDecoderExecutor : public Model {
 public:
  ~CudaDecoderExecutor() override;
  CudaDecoderExecutor(const CudaDecoderExecutor&) = delete;
  CudaDecoderExecutor& operator=(const CudaDecoderExecutor&) = delete;

  const ModelConfig& config() const override { return host_.config(); }
  size_t weight_bytes() const override { return ends_->bytes() + layer_bytes(); }
  size_t decode_weight_bytes() const override { return weight_bytes() - decode_unread_bytes(); }
  void* cuda_stream() const override { return stream_; }
  bool on_gpu() const override { return true; }
  std::vector<int> graph_batch_sizes() const override { return graphs_.batch_sizes(); }
  void capture_decode_graphs(const GraphSetup& setup, int max_tokens) override;

 protected:
  // The step's slots every decoder uses; a model's own slots start at kModelSlots.
  enum Slot : size_t {
    kIds, kPositions, kCacheLoc, kX, kXn, kRowIds, kSelected, kLogits, kCaptured, kModelSlots
  };
  static constexpr size_t kMaxSlots = 32;
  using Workspace = CudaStepWorkspace<kMaxSlots>;

  // host: the model on the host, which the executor keeps for as long as it lives (its ends and
  // config are read from it). deterministic: every product row computed the same way whatever
  // the number of rows.
  // vocab_begin, vocab_end: the lm_head rows this executor holds (0, 0: all; tensor parallelism).
  // tp_comm: a tensor-parallel rank's communicator (nullptr otherwise).
  CudaDecoderExecutor(std::unique_ptr<const CpuDecoder> host, Device device, bool deterministic,
                      int64_t vocab_begin = 0, int64_t vocab_end = 0, TpComm* tp_comm = nullptr,
                      bool nonblocking_stream = false);

  // The model's hooks: its layers over n tokens whose ids / positions / KV slots are in kIds /
  // kPositions / kCacheLoc, leaving the final hidden states in kX (and captured states in
  // kCaptured); its weights on the device besides the ends; its backend's metadata for an eager
  // step, a graph capture and a graph replay.
  virtual void run_layers(const ForwardBatch& batch, Workspace& ws, int64_t n, HiddenCapture* capture) = 0;
  virtual size_t layer_bytes() const = 0;
  // Of which a single-token decode step does not read (experts it does not pick, copies of a
  // weight that only other steps use).
  virtual size_t decode_unread_bytes() const { return 0; }
  virtual void init_metadata(const ForwardBatch& batch) = 0;
  virtual void init_capture_metadata(const ForwardBatch& batch) = 0;
  virtual void init_replay_metadata(const ForwardBatch& batch) = 0;
  // The backend's fixed CUDA-graph buffers for up to max_bs requests and max_tokens tokens.
  virtual void init_graph_state(int max_bs, int max_tokens) = 0;

  Buffer& scratch(Workspace& ws, size_t slot, DType dtype, int64_t elements);
  CudaStepLinear step_linear(Workspace& ws) const;
  void check_ids(const ForwardBatch& batch) const;
  // ids (with a verify's device tree tokens for its first `requests` requests), positions and
  // KV slots of the batch into ws.
  void upload_step(Workspace& ws, const ForwardBatch& batch, int requests);
  // A model's own per-step inputs, uploaded with the executor's (graph captures and replays too).
  virtual void upload_model_step(Workspace& /*ws*/, const ForwardBatch& /*batch*/) {}
  // Final norm and lm_head over `count` rows of kX (row ids in device memory, or the first
  // `count` rows when nullptr); returns the f32 logits (kLogits).
  float* run_head(Workspace& ws, const int32_t* row_ids, int64_t count);
  // An eager step: the backend's metadata, the layers, the head over the rows the step returns,
  // the download. results_hook (optional): queued work that reads the step's device results.
  void eager_forward(const ForwardBatch& batch, std::vector<float>& logits, const ForwardRequest& request,
                     const std::function<void()>& results_hook = {});
  // The step's results to the host: the logits of `rows` rows of ws (or the greedy ids), the
  // captured states, with results_hook queued before the wait.
  void download(const Workspace& ws, int64_t rows, std::vector<float>& logits, const ForwardRequest& request,
                const std::function<void()>& results_hook = {});
  // A DECODE batch through the smallest graph that holds it; false (nothing run) when none does.
  bool replay_decode(const ForwardBatch& batch, std::vector<float>& logits, const ForwardRequest& request);
  // The lm_head's rows: the vocabulary, or a tensor-parallel rank's part of it.
  int head_vocab() const;

  // Tensor parallelism (a rank's executor): combines the ranks' greedy tokens on the device.
  GreedyCombine tp_greedy_combine();

  std::unique_ptr<const CpuDecoder> host_owned_;
  const CpuDecoder& host_;
  Device device_;
  bool deterministic_;
  void* stream_ = nullptr;         // cudaStream_t
  void* results_event_ = nullptr;  // cudaEvent_t: a step's downloads done (download_step)
  std::unique_ptr<CudaLinear> linear_;
  PinnedBuffer pinned_;  // logits and captured states on their way to the host
  GreedyBuffers greedy_;  // the device's greedy tokens of a step, and their masks
  TpComm* tp_comm_ = nullptr;  // a tensor-parallel rank's communicator (ModelOptions::tp_comm)
  int64_t vocab_begin_ = 0;    // its first lm_head row
  Buffer tp_greedy_scratch_;
  std::unique_ptr<CudaDecoderEnds> ends_;
  Workspace eager_;
  Workspace graph_ws_;
  DecodeGraphs graphs_;
};

}  // namespace specula
