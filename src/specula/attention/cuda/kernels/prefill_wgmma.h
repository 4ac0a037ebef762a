// The wgmma prefill kernel (prefill_wgmma.cu): launch_prefill sends it the cases it supports.
#pragma once

#include <cuda_runtime_api.h>

#include "specula/attention/cuda/kernels/attention_params.h"

namespace specula::cuda_kernels {

// A cache of the query's 16-bit type at head_dim 64 or 128, or bf16 at head_dim 192 with v_head_dim
// 128; the only kernel that serves kv_row_start and q_kv_offset.
bool prefill_wgmma_supports(const AttentionParams& params);

void launch_prefill_wgmma(const AttentionParams& params, const PrefillWork& work, cudaStream_t stream);

}  // namespace specula::cuda_kernels
