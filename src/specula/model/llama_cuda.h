// LlamaCudaModel: the Model of a Llama-family decoder on a CUDA device (LlamaModel's arithmetic).
// Weight matrices are held in bf16 when the checkpoint's values are bf16 (else f32); activations
// are f32. Products: a bf16 GEMV kernel for up to 8 rows (decode), two bf16 tensor-core GEMMs
// over a hi/lo split of the activations for more rows (or GEMV passes of 8 rows in deterministic
// mode), cuBLAS sgemm for f32 weights; each layer is a CudaDecoderLayer; bf16 q/k/v through the
// CUDA attention backend over a bf16 or fp8 paged KV cache, K/V written by the q/k/v epilogue.
// The step skeleton and DECODE graphs are CudaDecoderExecutor's; TARGET_VERIFY steps of
// speculative decoding can run as graphs too (SGLang captures them in the same runner), which
// capture the hidden states a draft head reads.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "specula/attention/backend.h"
#include "specula/core/cuda_graph.h"
#include "specula/model/cuda/decoder_executor.h"
#include "specula/model/cuda/decoder_layer.h"
#include "specula/model/llama.h"

namespace specula {

class LlamaCudaModel final : public CudaDecoderExecutor {
 public:
  // Uploads the host model's weights and creates the attention backend on the model's stream.
  // options.deterministic: every product row is computed the same way whatever the number of
  // rows (the GEMV kernel, 8 rows per pass), so a request's results do not depend on its batch.
  // experts: where a mixture-of-experts model's routed experts are read from when the host model
  // holds none (LlamaModel's routed_experts false).
  LlamaCudaModel(std::unique_ptr<LlamaModel> host, const ModelOptions& options, const WeightSource* experts = nullptr);
  ~LlamaCudaModel() override;

  AttentionBackend* attention_backend() override { return backend_.get(); }
  const LlamaModel* llama() const override { return &model(); }
  void forward(ForwardBatch& batch, std::vector<float>& logits, const ForwardRequest& request) override;
  // One graph per batch size and tree size (each of num_draft_tokens tokens per request, prefix
  // visible), giving the logits of every token and the hidden states of capture_layers. Padding
  // requests have seq_len 1 in the padding row, whose positions [0, num_draft_tokens] map to
  // slots set aside for them. The graphs of every tree size share one workspace (they never run
  // at once), sized by the largest.
  void capture_verify_graphs(const GraphSetup& setup, const std::vector<int>& num_draft_tokens,
                             const std::vector<int>& capture_layers) override;

 private:
  // Dual chunk attention's key temperatures per token (dual_chunk_key_scales).
  static constexpr size_t kKeyScale = kModelSlots;
  void upload_model_step(Workspace& ws, const ForwardBatch& batch) override;
  void run_layers(const ForwardBatch& batch, Workspace& ws, int64_t n, HiddenCapture* capture) override;
  size_t layer_bytes() const override;
  size_t decode_unread_bytes() const override;
  void init_metadata(const ForwardBatch& batch) override { backend_->init_forward_metadata(batch); }
  void init_capture_metadata(const ForwardBatch& batch) override {
    backend_->init_forward_metadata_capture_cuda_graph(batch);
  }
  void init_replay_metadata(const ForwardBatch& batch) override {
    backend_->init_forward_metadata_replay_cuda_graph(batch);
  }
  void init_graph_state(int max_bs, int max_tokens) override { backend_->init_cuda_graph_state(max_bs, max_tokens); }
  // The host model the executor keeps.
  const LlamaModel& model() const { return static_cast<const LlamaModel&>(host_); }
  // A TARGET_VERIFY batch through the smallest verify graph that holds it; false (nothing run)
  // when no graph fits or the capture asks for other layers.
  bool forward_verify_graph(const ForwardBatch& batch, std::vector<float>& logits, const ForwardRequest& request);
  ForwardBatch verify_padding_batch(int batch_size, int num_draft_tokens) const;
  // The batch's SpecInfo::on_device_results over ws's ids and captured states and the step's
  // greedy ids, queued before the download's wait; empty when the batch has none or the step
  // returns no greedy ids or captured states.
  std::function<void()> results_hook(const ForwardBatch& batch, const Workspace& ws, const ForwardRequest& request);

  std::vector<CudaDecoderLayer> layers_;
  Workspace verify_ws_;
  std::map<int, CudaGraphSet> verify_graphs_;  // by tree tokens per request
  std::vector<int> verify_capture_layers_;
  GraphSetup verify_setup_;
  // Declared last, so it goes first: it runs on the model's stream.
  std::unique_ptr<AttentionBackend> backend_;
};

}  // namespace specula
