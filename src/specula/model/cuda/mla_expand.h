// The body of the expanded MLA form's MlaExpandFn on the GPU (the DeepSeek model and the MLA
// benchmark): kv_b_proj applied to gathered latent rows, written straight into K and V.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace specula {

class CudaLinear;

// kv_c bf16 [rows, rank], k_pe bf16 [rows, rope]; wkv_b bf16 [heads * (nope + v_dim), rank] (each
// head's nope key rows, then its v_dim value rows). Per head, k_nope = kv_c W_UK[h]^T into the
// first nope columns of k bf16 [rows, heads, nope + rope] and v = kv_c W_UV[h]^T into v bf16 [rows,
// heads, v_dim] (two strided-batched bf16 GEMMs), then k_pe into every head's last rope columns.
void expand_mla_rows(const CudaLinear& linear, const void* wkv_b, const void* kv_c, const void* k_pe, int64_t rows,
                     int heads, int rank, int nope, int rope, int v_dim, void* k, void* v, cudaStream_t s);

}  // namespace specula
