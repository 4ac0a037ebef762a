// Absorbed MLA attention on Hopper's warpgroup MMA (mla_wgmma.cu), for bf16 latent caches;
// launch_mla_attention sends it those steps.
#pragma once

#include <cuda_runtime_api.h>

#include "specula/attention/mla/cuda/kernels/mla_attention.h"

namespace specula::cuda_kernels {

void launch_mla_wgmma(const MlaAttentionParams& params, cudaStream_t stream);

}  // namespace specula::cuda_kernels
