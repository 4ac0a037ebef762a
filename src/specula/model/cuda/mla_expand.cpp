// expand_mla_rows: two CudaLinear::batched_bf16 calls and the k_pe broadcast kernel.
#include "specula/model/cuda/mla_expand.h"

#include "specula/model/cuda/cuda_linear.h"
#include "specula/model/cuda/mla_ops.h"

namespace specula {

void expand_mla_rows(const CudaLinear& linear, const void* wkv_b, const void* kv_c, const void* k_pe, int64_t rows,
                     int heads, int rank, int nope, int rope, int v_dim, void* k, void* v, cudaStream_t s) {
  const auto* w = static_cast<const uint16_t*>(wkv_b);
  const int64_t head_rows = static_cast<int64_t>(nope + v_dim) * rank;  // kv_b_proj values per head
  linear.batched_bf16({kv_c, rank, 0}, {w, rank, head_rows}, k, static_cast<int64_t>(heads) * (nope + rope),
                      nope + rope, rows, rank, nope, heads);
  linear.batched_bf16({kv_c, rank, 0}, {w + static_cast<int64_t>(nope) * rank, rank, head_rows}, v,
                      static_cast<int64_t>(heads) * v_dim, v_dim, rows, rank, v_dim, heads);
  cuda_kernels::mla_broadcast_k_pe(k_pe, k, rows, heads, nope, rope, s);
}

}  // namespace specula
