// The expanded MLA form's gather: latent rows of listed cache slots as bf16, the GEMM operands of
// the expansion (bf16 rows as they are; fp8_ds_mla rows dequantised as the host codec,
// decode_mla_row, does, then rounded to bf16 as the absorbed kernel's MMA operands are).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace specula::cuda_kernels {

struct GatherLatentParams {
  const uint8_t* cache;   // [num_slots, row_bytes] latent rows at kv_lora_rank 512 + rope 64
  int32_t fp8;            // 0: bf16 rows; 1: fp8_ds_mla rows
  int64_t row_bytes;
  const int32_t* slots;   // [rows]
  int64_t rows;
  void* kv_c;             // bf16 [rows, 512]
  void* k_pe;             // bf16 [rows, 64]
};

void launch_gather_latent(const GatherLatentParams& params, cudaStream_t stream);

}  // namespace specula::cuda_kernels
