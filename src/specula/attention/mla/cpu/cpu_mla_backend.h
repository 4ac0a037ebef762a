// CpuMlaBackend: MLA attention on the CPU in the absorbed form, the oracle the CUDA MLA backend
// is tested against. Every mode of mla_backend.h over bf16 and fp8_ds_mla latent caches, any
// page size, sparse top-k indices, sinks, LSE, the chunked-prefix extend path, and the lightning
// indexer. f32 accumulation throughout; key rows are dequantised exactly as the pool defines.
#pragma once

#include <cstdint>
#include <vector>

#include "specula/attention/metadata.h"
#include "specula/attention/mla/mla_backend.h"

namespace specula {

class CpuMlaBackend final : public MlaAttentionBackend {
 public:
  explicit CpuMlaBackend(const MlaBackendOptions& options);

  std::string_view name() const override { return "cpu"; }
  void check_layer(const MlaLayer& layer, DType q_dtype, MlaKVFormat kv_format) const override;
  void init_forward_metadata(const ForwardBatch& batch) override;
  void forward(const TensorView& q, const TensorView& kv_c, const TensorView& k_pe, const TensorView& out,
               const MlaLayer& layer, const ForwardBatch& batch, const MlaForwardOptions& options) override;
  void indexer_topk(const TensorView& q, const TensorView& weights, const TensorView& index_k, const MlaLayer& layer,
                    const ForwardBatch& batch, const TensorView& out, bool save_index_k) override;

 private:
  struct Metadata {
    const ForwardBatch* batch = nullptr;
    ForwardMode mode = ForwardMode::IDLE;
    int64_t num_tokens = 0;
    PageTable page_table;
    std::vector<int32_t> kv_lens;           // [batch_size]
    std::vector<int32_t> first_token;       // [batch_size] index of the request's first query
    std::vector<int32_t> req_id_per_token;  // [num_tokens]
    std::vector<int32_t> token_pos;         // [num_tokens] KV position of each query
    std::vector<int64_t> mask_offset;       // [batch_size] TARGET_VERIFY custom mask blocks
    int num_prefix_chunks = 0;              // extend with prefix_chunk_tokens > 0
  };

  MlaBackendOptions options_;
  ThreadPool* threads_;
  Metadata metadata_;
};

}  // namespace specula
