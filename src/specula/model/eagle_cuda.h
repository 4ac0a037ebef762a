// EagleCudaModel: an EagleHead's weights on a CUDA device (matrices as the checkpoint holds them,
// bf16 when exactly bf16) and its forward as launches on a given stream: the EAGLE input fc or
// EAGLE-3's fused features and input norms, the midlayer (a CudaDecoderLayer, attention through a
// hook), and the logits of chosen rows over the draft vocabulary. The speculative draft loop
// (speculative/eagle_cuda_head) drives it; nothing here synchronises, so every forward can be
// captured in a CUDA graph.
#pragma once

#include <cstdint>
#include <memory>

#include "specula/core/tensor.h"
#include "specula/model/cuda/decoder_layer.h"
#include "specula/model/eagle_head.h"

namespace specula {

class CudaLinear;

class EagleCudaModel {
 public:
  // The model's slots; a caller's own slots of the same workspace start at kCallerSlots.
  enum Slot : size_t { kX, kA, kEmb, kXn, kSelected, kLogits, kCallerSlots };
  static constexpr size_t kMaxSlots = 16;
  using Workspace = CudaStepWorkspace<kMaxSlots>;

  // stream: the cudaStream_t the head runs on (the target's).
  EagleCudaModel(const EagleHead& head, Device device, void* stream);
  ~EagleCudaModel();
  EagleCudaModel(const EagleCudaModel&) = delete;
  EagleCudaModel& operator=(const EagleCudaModel&) = delete;

  const EagleHead& head() const { return head_; }
  Device device() const { return device_; }
  // EAGLE-3's draft -> target id offsets (i64 [draft_vocab]) on the device; empty for EAGLE.
  const Buffer& d2t() const { return d2t_; }

  // The head over n rows of ids, positions and hidden_in (device; target features when
  // from_target, else [n, hidden] hidden states of earlier steps). Leaves the next hidden states
  // in kX and the logits of `rows` rows in kLogits: the rows of row_ids (device), or the first
  // ones when row_ids is nullptr. kv: where the q/k/v epilogue writes K/V (then attend must not
  // write them again), or nowhere.
  void forward(Workspace& ws, int64_t n, const int32_t* ids, const int32_t* positions, const float* hidden_in,
               bool from_target, const CudaAttend& attend, const int32_t* row_ids, int64_t rows,
               const CudaKvWrite& kv = {});

 private:
  Buffer& scratch(Workspace& ws, Slot slot, DType dtype, int64_t elements) {
    return ws.get(slot, dtype, elements, device_);
  }

  const EagleHead& head_;
  Device device_;
  void* stream_;
  std::unique_ptr<CudaLinear> linear_;
  Buffer embed_, fc_, fc_bias_, input_norm_, hidden_norm_, final_norm_, lm_head_, d2t_, inv_freq_;
  std::unique_ptr<CudaDecoderLayer> layer_;  // the midlayer
};

}  // namespace specula
