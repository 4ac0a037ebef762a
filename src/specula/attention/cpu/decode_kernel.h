// The CPU decode kernel for bf16 and e4m3 KV with AVX512-BF16 dot products
// (decode_kernel_bf16.cpp): a work item of one query token and up to kMaxDecodeHeads query heads
// of one KV head. The tile kernel (tile_kernel.h) serves every other item, and every item where
// the processor lacks AVX512-BF16.
#pragma once

#include <cstddef>

#include "specula/attention/cpu/tile_kernel.h"

namespace specula {

inline constexpr int kMaxDecodeHeads = 16;

// Whether this processor has AVX-512 with BF16 dot products.
bool cpu_has_avx512_bf16();

// Scratch floats the decode kernel needs for head dims D / Dv and G query heads (the last part:
// an e4m3 cache's tile of 16 K and V rows as bf16).
inline size_t decode_scratch_floats(int head_dim, int v_head_dim, int heads) {
  return static_cast<size_t>(((3 * heads + 1) * head_dim + 1) / 2 + heads * v_head_dim + heads * 16 +
                             8 * (head_dim + v_head_dim));
}

namespace cpu_avx512bf16 {
// Whether a call's parameters suit the kernel: bf16 K/V without descales, no custom mask, head
// dims multiples of 32 (K) and 16 (V).
bool decode_supported(const CpuAttentionParams& p);
// One item: q_count == 1 and num_heads <= kMaxDecodeHeads; scratch holds decode_scratch_floats.
// An item with a partial slot (decode_split.h) attends to its keys only and writes each head's
// output normalised by its own sum, then each head's log-sum-exp, to partials + item.partial.
void decode_item(const CpuAttentionParams& p, const CpuAttentionSeq& seq, const CpuWorkItem& item,
                 CpuAttentionScratch& scratch, float* partials);
}  // namespace cpu_avx512bf16

}  // namespace specula
