// The CPU attention kernel's interface: raw pointers and Params structs only (no engine types),
// a plan of work items built once per step, and an entry point per instruction set.
//
// Work decomposition: one work item is (sequence, KV head, a block of query tokens, a chunk of
// that KV head's query heads). Its rows (query token x query head) sit in the lanes of a
// W-float vector (W = 8 or 16), so Q.K^T and P.V are lane-parallel FMAs with no horizontal
// reductions, and each K/V row is converted once per work item for all the rows that share it
// (GQA heads are packed together). K/V are walked in tiles with an online softmax.
#pragma once

#include <climits>
#include <cstdint>
#include <span>
#include <vector>

#include "specula/core/dtype.h"

namespace specula {

class ThreadPool;

struct CpuAttentionParams {
  const void* q;            // [num_tokens, num_q_heads, head_dim], strides in elements below
  DType q_dtype;
  int64_t q_stride_token;
  int64_t q_stride_head;
  void* out;                // [num_tokens, num_q_heads, v_head_dim]
  DType out_dtype;
  int64_t out_stride_token;
  int64_t out_stride_head;
  float* lse;               // [num_tokens, num_q_heads] or nullptr
  int64_t lse_stride_token;
  const void* k_cache;      // [num_slots, num_kv_heads, head_dim]
  const void* v_cache;      // [num_slots, num_kv_heads, v_head_dim]
  DType kv_dtype;
  float k_descale;          // multiplies every K element read (fp8 scales; 1 otherwise)
  float v_descale;
  int num_q_heads;
  int num_kv_heads;
  int head_dim;
  int v_head_dim;
  int page_size;
  float scale;              // softmax scale applied to q.k
  float logit_cap;          // > 0: cap * tanh(s / cap)
  int window_left;          // -1: none; else keys j >= pos - window_left
  bool causal;              // key j visible to the query at KV index pos iff j <= pos
  const float* sinks;       // [num_q_heads] or nullptr
  const uint8_t* custom_mask;  // nullptr, or per sequence [q_len, kv_len] at seq.mask_offset
};

struct CpuAttentionSeq {
  int32_t q_start;       // first token row of this sequence in q / out / lse
  int32_t q_len;
  int32_t kv_len;
  int32_t q_kv_offset;   // KV index of query row 0 (query i sits at q_kv_offset + i)
  const int32_t* pages;  // [ceil(kv_len / page_size)] page ids of this sequence
  int64_t mask_offset;   // offset of this sequence's [q_len, kv_len] block in custom_mask
};

struct CpuWorkItem {
  int32_t seq;
  int32_t kv_head;
  int32_t head_begin;  // first query head of the item, relative to the KV head's group
  int32_t num_heads;
  int32_t q_begin;     // first query row of the item, relative to the sequence
  int32_t q_count;
  // The decode kernel only (decode_split.h): keys [key_begin, key_end) of the visible ones, its
  // result unnormalised across chunks, written at `partial` floats into the call's partial buffer
  // (-1: the whole key range, result straight to out).
  int32_t key_begin = 0;
  int32_t key_end = INT32_MAX;
  int64_t partial = -1;
};

struct CpuAttentionPlan {
  int lanes = 16;  // W: rows per item <= lanes
  std::vector<CpuWorkItem> items;
};

// Splits every sequence into work items; longest items first so the dynamic schedule ends
// evenly.
CpuAttentionPlan plan_cpu_attention(std::span<const CpuAttentionSeq> seqs, int num_q_heads, int num_kv_heads);

// Keys per K/V tile of the online softmax.
inline constexpr int kCpuTileKeys = 32;

// Per-thread scratch, sized by run_cpu_attention before the kernel runs (the kernel itself never
// allocates: the AVX-512 translation unit must not instantiate library templates, whose weak
// copies the linker could pick for callers on processors without AVX-512).
struct CpuAttentionScratch {
  std::vector<float> buffer;
};
inline size_t cpu_attention_scratch_floats(int head_dim, int v_head_dim, int lanes) {
  return static_cast<size_t>(head_dim * lanes + kCpuTileKeys * head_dim + kCpuTileKeys * v_head_dim +
                             kCpuTileKeys * lanes + v_head_dim * lanes);
}

enum class CpuIsa : uint8_t { generic, avx512 };
CpuIsa best_cpu_isa();              // avx512 when the processor has AVX-512F
const char* cpu_isa_name(CpuIsa isa);

void run_cpu_attention(CpuIsa isa, const CpuAttentionParams& params, std::span<const CpuAttentionSeq> seqs,
                       const CpuAttentionPlan& plan, std::vector<CpuAttentionScratch>& scratch, ThreadPool& pool);

// One instantiation per instruction set (tile_kernel_generic.cpp, tile_kernel_avx512.cpp).
namespace cpu_generic {
void run_item(const CpuAttentionParams& p, const CpuAttentionSeq& seq, const CpuWorkItem& item, int lanes,
              CpuAttentionScratch& scratch);
}
namespace cpu_avx512 {
void run_item(const CpuAttentionParams& p, const CpuAttentionSeq& seq, const CpuWorkItem& item, int lanes,
              CpuAttentionScratch& scratch);
}

}  // namespace specula
