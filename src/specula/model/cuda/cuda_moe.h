// CudaMoe: a mixture-of-experts MLP layer on the GPU (DeepSeek-V2/V3, Qwen3-MoE, Mixtral), the
// fused-MoE design of vLLM and SGLang over specula's f32 activations: the router's product (as
// the dense layers compute theirs), routing and the expert sort on the device (moe_kernels.h),
// two grouped GEMMs that read only the selected experts' weights (the gate|up one ends in the
// SiLU gate), and one weighted combine. The shared experts are stacked after the routed ones and
// picked by every token with weight 1 (SGLang's shared-expert fusion): one pass over all the
// layer's weights a token needs. No host sync: a decode step is captured in a CUDA graph as it is.
//
// Routed experts are held in bf16 (a checkpoint's f32 or f16 values are rounded), stacked per
// layer: gate|up as [experts, 2 inter', hidden] with 32 gate rows and then the same 32 up rows
// in turn (the GEMM's gate epilogue finds both in one tile), down as [experts, hidden, inter'],
// inter' = moe_intermediate_size rounded up to 32 with zero padding; experts = routed + shared.
// From an fp8 block-scaled checkpoint (Fp8BlockWeights) the experts stay fp8 on the device, half
// the bytes: e4m3 codes in the same layouts and each row's f32 block scales, which the GEMM
// applies as it turns a code into the bf16 operand (the bits a dequantization to bf16 gives).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "specula/core/tensor.h"
#include "specula/model/config.h"
#include "specula/model/cuda/moe_kernels.h"
#include "specula/model/moe.h"
#include "specula/model/weights.h"

namespace specula {

struct CudaStepLinear;
struct CudaLayerScratch;

class Fp8BlockWeights;

class CudaMoe {
 public:
  // host: the layer's router, correction bias and shared experts, and its routed experts when
  // loaded (host.experts); otherwise those are read from `source` under layer `prefix`'s names,
  // one expert at a time. keep_fp8: an fp8 source's experts stay fp8 (else they become bf16).
  CudaMoe(const MoeConfig& config, const MoeWeights& host, const WeightSource* source, const std::string& prefix,
          int hidden, Device device, bool keep_fp8 = false);

  size_t bytes() const;
  // Of which a single token does not read: the routed experts it does not pick.
  size_t unread_bytes() const;
  bool fp8() const { return fp8_; }
  // out [n, hidden] = the layer's MLP output for xn [n, hidden] (normed). Scratch from
  // linear.scratch; runs on s.
  void forward(const float* xn, float* out, int64_t n, const CudaStepLinear& linear, cudaStream_t s) const;
  // Which grouped GEMM kernels run: the engine's choice (automatic), or for bench moe's
  // comparisons the large tile on mma.sync (the kernel warpgroup MMA replaced), or bf16
  // activations (the hi term alone, as peers multiply; not f32-accurate, never the engine's);
  // unpaired: warpgroup MMA without the 2-block clusters that share the rows' loads;
  // decode_shallow / decode_deep: the small tile's warpgroup-MMA kernel at 3 or 5 stages
  // whatever its grid (tests cover both).
  enum class GemmVariant { automatic, mma_sync, bf16_activations, unpaired, decode_shallow, decode_deep };
  // The two grouped GEMMs of the forward of n tokens that last ran over `scratch`, again over the
  // routing and activations it left there (forward's middle; bench moe times it alone).
  void grouped_gemms(int64_t n, const CudaLayerScratch& scratch, cudaStream_t s,
                     GemmVariant variant = GemmVariant::automatic) const;

 private:
  // The sizes of a step of n tokens: rows per token, stacked experts, (token, expert) pairs, the
  // sorted rows the workspace holds, the tile and its most blocks.
  struct StepShape {
    int per_token = 0, stacked = 0;
    int64_t pairs = 0, rows = 0, blocks = 0;
    cuda_kernels::MoeTile tile{};
  };
  StepShape step_shape(int64_t n) const;
  // Whether the gate|up rows are laid out in block-list order for warpgroup MMA (the large tile)
  // rather than gathered from the tokens' rows by the kernel.
  bool in_block_order(const StepShape& sh) const;
  // Row r of gate (or, kInterleave rows further, of up) in the gate|up layout.
  static int64_t gate_row(int64_t r);
  // The routed and shared experts' codes and scales, when the checkpoint holds them in fp8 in
  // blocks the kernel can apply (fp8_ set); otherwise nothing.
  void upload_fp8(const Fp8BlockWeights& source, const std::string& prefix, Device device);

  MoeConfig config_;
  int hidden_ = 0, inter_ = 0, inter_padded_ = 0, shared_ = 0;
  bool fp8_ = false;
  int scale_k_ = 0;  // fp8: values of k per scale
  Buffer router_, bias_;
  Buffer w_gate_up_, w_down_;  // bf16 (or fp8 codes), the layouts above
  Buffer scale_gate_up_, scale_down_;  // fp8: f32 [experts, rows, ceil(k / scale_k)]
};

}  // namespace specula
