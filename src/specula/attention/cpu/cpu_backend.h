// CpuAttentionBackend: the CPU implementation of AttentionBackend, and the oracle every other
// backend is tested against. It supports every variant: causal and non-causal varlen extend
// with cached prefix, decode, MHA/GQA/MQA, head_dim 64/80/96/128/256, any power-of-two page
// size, sliding window, local chunked attention, logit soft-cap, sinks, custom scale, TARGET_VERIFY
// tree masks, LSE output and an fp8 e4m3 cache with descale.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <tuple>
#include <optional>
#include <string>
#include <vector>

#include "specula/attention/backend.h"
#include "specula/attention/cpu/dual_chunk_parts.h"
#include "specula/attention/cpu/tile_kernel.h"
#include "specula/attention/metadata.h"

namespace specula {

// The one selection function for CPU attention: answers "supported?" (an empty reason) for a
// layer; check_layer and the run path both go through it, so they cannot drift apart.
struct CpuKernelChoice {
  std::string unsupported_reason;  // empty when supported
};
CpuKernelChoice select_cpu_attention_kernel(const AttentionLayer& layer, DType q_dtype, DType kv_dtype,
                                            int page_size);

class CpuAttentionBackend final : public AttentionBackend {
 public:
  explicit CpuAttentionBackend(const AttentionBackendOptions& options);

  std::string_view name() const override { return "cpu"; }
  void check_layer(const AttentionLayer& layer, DType q_dtype, DType kv_dtype) const override;
  void init_forward_metadata(const ForwardBatch& batch) override;
  void forward_extend(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                      const AttentionLayer& layer, const ForwardBatch& batch,
                      const ForwardOptions& options) override;
  void forward_decode(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                      const AttentionLayer& layer, const ForwardBatch& batch,
                      const ForwardOptions& options) override;

  // Forces the portable kernel (tests run both); by default the best one for this processor,
  // or SPECULA_CPU_ISA=generic|avx512 from the environment.
  void set_isa(CpuIsa isa) { isa_ = isa; }
  CpuIsa isa() const { return isa_; }

 private:
  using HeadLayout = std::tuple<int, int, bool>;

  struct Metadata {
    ForwardMode mode = ForwardMode::IDLE;
    const ForwardBatch* batch = nullptr;
    PageTable page_table;
    std::vector<CpuAttentionSeq> seqs;        // one per request
    std::vector<int32_t> local_page_storage;  // block_table_local
    std::vector<CpuAttentionSeq> local_seqs;  // one per local-attention virtual request
    int64_t num_tokens = 0;
    // One plan per head layout (num_q_heads, num_kv_heads, local) that check_layer has seen,
    // built here once per step and shared by every layer with that layout.
    std::map<HeadLayout, CpuAttentionPlan> plans;
    // Dual chunk layers' kernel passes, planned on the step's first such layer.
    std::optional<DualChunkPassPlan> dual_chunk_parts;
  };

  void run(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
           const AttentionLayer& layer, const ForwardBatch& batch, const ForwardOptions& options);

  AttentionBackendOptions options_;
  ThreadPool* pool_;
  CpuIsa isa_;
  Metadata metadata_;
  // Head layouts of the layers this backend serves, recorded by check_layer at start-up.
  mutable std::set<HeadLayout> layouts_;
  std::vector<CpuAttentionScratch> scratch_;
};

}  // namespace specula
