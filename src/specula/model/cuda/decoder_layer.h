// CudaDecoderLayer: one Llama-family decoder layer on the GPU (the q/k/v product and its fused
// epilogue, attention through a hook, o_proj, the gated MLP, residual adds and norms), used by
// every layer of LlamaCudaModel and by the EAGLE / EAGLE-3 heads' midlayer (EagleCudaModel).
// Weights as the checkpoint holds them (bf16 matrices when exactly bf16, else f32); f32
// activations; bf16 q/k/v for attention. CudaLayerScratch holds the activations of one step
// (named slots; a CUDA-graph workspace is frozen after its warm-up).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "specula/core/tensor.h"
#include "specula/model/cuda/workspace.h"
#include "specula/model/decoder_layer.h"
#include "specula/model/weights.h"

namespace specula {

class CudaLinear;
class CudaMoe;
class TpComm;

enum CudaLayerSlot : size_t { kLayerQkv, kLayerQ, kLayerK, kLayerV, kLayerAttnBf16, kLayerAttnF32, kLayerO,
                              kLayerGateUp, kLayerAct, kLayerSplit, kLayerHalves,
                              // A mixture-of-experts layer's (CudaMoe).
                              kMoeLogits, kMoeIds, kMoeWeights, kMoeSorted, kMoeBlockExpert, kMoeSlot, kMoeBlocks,
                              kMoeX, kMoeAct, kMoeY, kNumLayerSlots };

struct CudaLayerScratch {
  CudaWorkspace<kNumLayerSlots> ws;
  Buffer& get(CudaLayerSlot slot, DType dtype, int64_t elements, Device device) {
    return ws.get(slot, dtype, elements, device);
  }
};

// A step's activations: an owner's own slots (its enum Slot) and its layers' scratch. A graph's
// workspace is frozen after the warm-up that sized it.
template <size_t kSlots>
struct CudaStepWorkspace {
  CudaWorkspace<kSlots> main;
  CudaLayerScratch layer;
  void freeze() { main.frozen = layer.ws.frozen = true; }
  Buffer& get(size_t slot, DType dtype, int64_t elements, Device device) { return main.get(slot, dtype, elements, device); }
  Buffer& operator[](size_t slot) { return main.slots[slot]; }
  const Buffer& operator[](size_t slot) const { return main.slots[slot]; }
};

// The products of one step: y[n, out] = x[n, in] w[out, in]^T (+ bias), with the bf16 hi/lo
// split scratch the tensor-core path needs taken from scratch.
struct CudaStepLinear {
  const CudaLinear& linear;
  CudaLayerScratch& scratch;
  Device device;
  // The split scratch of a product of n rows (CudaLinear::operator()): stacked where it may be.
  struct Split {
    void* hi = nullptr;
    void* lo = nullptr;
    float* halves = nullptr;
  };
  Split split(const Buffer& w, int64_t n, int in, int out) const;
  void operator()(const float* x, const Buffer& w, const Buffer& bias, float* y, int64_t n, int in, int out) const;
};

// Where the layer's new K/V rows go: straight into the paged cache by the q/k/v epilogue
// (cache_loc set), or nowhere (the attention hook writes them).
struct CudaKvWrite {
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  const int32_t* cache_loc = nullptr;  // [n] device
  int cache_dtype = 0;                 // DTypeCode
  float k_scale = 1.0f, v_scale = 1.0f;
};

// q, k, v, out: bf16 [n, heads, head_dim] device views.
using CudaAttend = std::function<void(const TensorView& q, const TensorView& k, const TensorView& v,
                                      const TensorView& out)>;

struct CudaLayerStep {
  int64_t n = 0;
  const float* attn_input = nullptr;  // [n, dims.attn_in], already normed as the layer expects
  float* x = nullptr;                 // [n, hidden] the residual stream, updated in place
  float* xn = nullptr;                // [n, hidden] scratch: the MLP's normed input
  const int32_t* positions = nullptr;  // [n] device
  const float* inv_freq = nullptr;     // [rotated dims / 2] device
  float rope_factor = 1.0f;
  // Dual chunk attention (ck::QkvEpilogueParams): the chunk length (0: none), chunk size, q's
  // rotary variants per head (the attention then takes q as [n, heads, q_variants * head_dim])
  // and each token's key temperature ([n] device, or nullptr).
  int dca_chunk_len = 0;
  int dca_chunk_size = 0;
  int q_variants = 1;
  const float* key_scale = nullptr;
  CudaKvWrite kv;
  // Tensor parallelism: the layer holds a shard (its heads and intermediate columns), and the
  // partial sums of o_proj and down_proj are all-reduced over the ranks before anything else
  // reads them (Gemma-2's output norms need the whole sum).
  TpComm* comm = nullptr;
  // After the MLP's residual add, end_out = RMSNorm(x) * end_norm (the next layer's input norm,
  // or a final norm) in the same launch, and the new x also goes to end_copy (a captured hidden
  // state, rows end_copy_stride apart); without end_norm, only the add.
  const float* end_norm = nullptr;
  float* end_out = nullptr;
  float* end_copy = nullptr;
  int64_t end_copy_stride = 0;
};

class CudaDecoderLayer {
 public:
  // A mixture-of-experts layer (w.moe.layer) whose routed experts the host did not load reads
  // them from `experts` under layer `prefix`'s names (CudaMoe).
  CudaDecoderLayer(const DecoderLayerWeights& w, const DecoderLayerDims& dims, Device device,
                   const WeightSource* experts = nullptr, const std::string& prefix = {}, bool fp8_experts = false);
  ~CudaDecoderLayer();
  CudaDecoderLayer(CudaDecoderLayer&&) noexcept;

  const DecoderLayerDims& dims() const { return dims_; }
  const Buffer& input_norm() const { return input_norm_; }
  size_t bytes() const;  // of the weights as held on the device
  size_t moe_unread_bytes() const;  // of which a single token does not read (CudaMoe::unread_bytes)

  void forward(const CudaLayerStep& step, const CudaAttend& attend, const CudaStepLinear& linear,
               cudaStream_t s) const;

 private:
  DecoderLayerDims dims_;
  Buffer input_norm_, post_norm_, post_attn_norm_, post_ffn_norm_;
  Buffer w_qkv_, b_qkv_;          // [q + 2 kv, attn_in]: q_proj | k_proj | v_proj
  Buffer wo_, bo_;
  Buffer w_gate_up_, b_gate_up_;  // [2 intermediate, hidden]: gate_proj | up_proj
  Buffer w_down_, b_down_, q_norm_, k_norm_;
  std::unique_ptr<CudaMoe> moe_;  // instead of the gated MLP
};

}  // namespace specula
