// MLA cache writes on the GPU: new tokens' latent rows (bf16, or fp8_ds_mla with one f32 scale
// per 128-value tile) and the lightning indexer's keys (fp8 with one f32 scale per key), laid out
// and rounded exactly as the host encoders in kv/mla_kv_pool.cpp, so the bytes are identical.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace specula::cuda_kernels {

// Row formats; the values match specula::MlaKVFormat.
enum MlaRowFormat : int32_t { kMlaRowBf16 = 0, kMlaRowFp8DsMla = 1 };

inline constexpr int kMlaFp8Tile = 128;  // values per f32 scale in fp8_ds_mla rows

struct MlaSetKVParams {
  const void* kv_c;          // [num_tokens, kv_lora_rank], dtype kv_c_dtype, contiguous rows
  int64_t kv_c_stride;       // elements between tokens in kv_c
  int32_t kv_c_dtype;        // DTypeCode: f32, f16 or bf16
  const void* k_pe;          // [num_tokens, qk_rope_head_dim], dtype k_pe_dtype, contiguous rows
  int64_t k_pe_stride;       // elements between tokens in k_pe
  int32_t k_pe_dtype;        // DTypeCode: f32, f16 or bf16
  const int32_t* loc;        // [num_tokens] destination slots, each in [0, num_slots)
  int64_t num_tokens;
  void* cache;               // u8 [num_slots, row_bytes]
  int64_t row_bytes;         // bf16: 2 * (kv_lora_rank + qk_rope_head_dim);
                             // fp8_ds_mla: kv_lora_rank + 4 * kv_lora_rank / 128 + 2 * qk_rope_head_dim
  int32_t kv_lora_rank;      // fp8_ds_mla: a multiple of kMlaFp8Tile
  int32_t qk_rope_head_dim;  // fp8_ds_mla: even, so that every row's f32 scales are 4-byte aligned
  int32_t format;            // MlaRowFormat
};

struct MlaSetIndexKParams {
  const void* k;           // [num_tokens, index_head_dim], dtype k_dtype, contiguous rows
  int64_t k_stride;        // elements between tokens in k
  int32_t k_dtype;         // DTypeCode: f32, f16 or bf16
  const int32_t* loc;      // [num_tokens] destination slots, each in [0, num_slots)
  int64_t num_tokens;
  void* cache;             // u8 [num_slots, index_head_dim + 4]: fp8 e4m3 values, then an f32 scale
  int32_t index_head_dim;  // a positive multiple of 16
};

// Both run on `stream` without a sync (graph-capturable); loc is trusted (not range-checked).
void launch_mla_set_kv_buffer(const MlaSetKVParams& params, cudaStream_t stream);
void launch_mla_set_index_k(const MlaSetIndexKParams& params, cudaStream_t stream);

}  // namespace specula::cuda_kernels
