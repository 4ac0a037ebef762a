// DeepseekCudaModel: the Model of DeepseekModel's decoder on a CUDA device, over the step
// skeleton and DECODE graphs of CudaDecoderExecutor. Weight
// matrices are held in bf16 when the checkpoint's values are bf16 (else f32), except kv_b_proj,
// whose per-head halves W_UK and W_UV multiply f32 activations in cuBLAS strided-batched sgemms;
// activations are f32. One product computes q (or q_a) and the latent [c ; k_pe] together; bf16
// absorbed queries go to the CUDA MLA backend, which writes the latent rows into the pool (bf16
// or fp8_ds_mla) and returns latent outputs. Extend steps the backend plans in the expanded form
// send [q_nope ; q_pe] instead and get per-head values back; the model expands the cached latent
// rows the backend gathers with bf16 batched GEMMs per pass (kv_b_proj rounded to bf16: the
// keys and values are bf16 MMA operands anyway).
#pragma once

#include <memory>
#include <vector>

#include "specula/attention/mla/mla_backend.h"
#include "specula/core/tensor.h"
#include "specula/model/cuda/cuda_moe.h"
#include "specula/model/cuda/decoder_executor.h"
#include "specula/model/deepseek.h"

namespace specula {

class DeepseekCudaModel final : public CudaDecoderExecutor {
 public:
  // Uploads the host model's weights and creates the MLA backend on the model's stream.
  // experts: where the routed experts are read from when the host model holds none
  // (DeepseekModel's routed_experts false).
  DeepseekCudaModel(std::unique_ptr<DeepseekModel> host, const ModelOptions& options, const WeightSource* experts = nullptr);
  ~DeepseekCudaModel() override;

  MlaAttentionBackend* mla_backend() override { return backend_.get(); }
  void forward(ForwardBatch& batch, std::vector<float>& logits, const ForwardRequest& request) override;

 private:
  struct Layer {
    Buffer input_norm, post_norm;
    Buffer w_in;       // [q rows + kv_lora_rank + rope, hidden]: q_proj (or q_a_proj) | kv_a_proj_with_mqa
    Buffer q_a_norm, wq_b, kv_a_norm;
    Buffer wkv_b;      // f32 [heads * (nope + v), kv_lora_rank]
    Buffer wkv_b_bf16;  // the same in bf16, for the expanded form's keys and values
    Buffer wo, w_gate_up, w_down;
    std::unique_ptr<CudaMoe> moe;  // a mixture-of-experts layer's MLP, instead of w_gate_up / w_down
  };
  // The MLA layer's own slots, after the executor's.
  enum MlaSlot : size_t {
    kIn = kModelSlots, kQa, kQ, kQLatent, kQAbs, kKvC, kKPe, kOut, kOutF32, kValues, kO, kGateUp, kAct, kNumMlaSlots
  };
  static_assert(kNumMlaSlots <= kMaxSlots);

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
  const DeepseekModel& model() const { return static_cast<const DeepseekModel&>(host_); }

  std::vector<Layer> layers_;
  // Declared last, so it goes first: it runs on the model's stream.
  std::unique_ptr<MlaAttentionBackend> backend_;
};

}  // namespace specula
