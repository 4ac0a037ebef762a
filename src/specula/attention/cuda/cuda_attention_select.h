// The CUDA attention backend's selection functions (ggml's fattn.cu convention): for each
// operation (decode, extend, TARGET_VERIFY, draft tree) one function answers together whether the
// layer is served (or why not, naming the value and what is allowed), which kernel serves it and
// the workspace it needs, so check_layer, the per-step planning and the launches cannot drift
// apart.
#pragma once

#include <cstdint>
#include <string>

#include "specula/attention/backend.h"

namespace specula {

// How a decode step's keys are split: splits per (sequence, KV-head block) and warps per block.
struct DecodePlan {
  int splits = 1;
  int warps = 4;
};

// Decode split heuristic: never splitting when the batch already fills the GPU, never below 256
// keys per split. Few (sequence, KV-head block) pairs (at most half the multiprocessors) get one
// wide block per multiprocessor; otherwise about two blocks of 4 warps per multiprocessor.
DecodePlan choose_decode_plan(int batch_size, int kv_head_blocks, int max_kv_len, int num_sms);

enum class CudaAttentionKernel : uint8_t {
  kNone,          // unsupported: CudaAttentionPlan::unsupported_reason says why
  kDecode,        // kernels/decode.cu: split-KV decode, one query row per sequence
  kPrefillWgmma,  // kernels/prefill_wgmma.cu: warpgroup MMA, a cache of the query's type, head_dim 64 / 128
  kPrefillMma,    // kernels/prefill.cu: mma.sync, every other supported layer
  kTree,          // kernels/tree_attention.cu: each row over its sequence's prefix plus its own KV slots
};

// The facts besides the layer and its dtypes that selection reads; each selection function says
// which of them it uses, the others may keep their defaults.
struct CudaAttentionShape {
  int page_size = 1;
  int attention_chunk_size = 0;  // layers with use_local_attention need one
  // Decode: the split plan's inputs. max_kv_len is the step's longest KV (max_context_len when a
  // CUDA graph plans for any length); deterministic plans as for one request of max_context_len.
  int batch_size = 0;
  int64_t num_tokens = 0;
  int max_kv_len = 0;
  int num_sms = 0;
  bool deterministic = false;
  int max_context_len = 0;
  // Extend: the K/V rows the step's sequences attend and the L2 size (the wgmma kernel's head
  // groups), and whether the step reads a tree mask.
  int64_t kv_rows = 0;
  int64_t l2_bytes = 0;
  bool custom_mask = false;
  // Tree kernel: whether the step staged the tree kernel's arrays (verify), and whether q and out
  // are dense [rows, num_q_heads, head_dim] (the kernel reads them without strides).
  bool tree_staged = false;
  bool rows_contiguous = true;
};

// The split-KV decode workspace one layer needs (zero when it does not split); a step's layers
// share the largest.
struct DecodeWorkspace {
  int64_t partial_rows = 0;    // f32 partial LSEs: [splits, num_tokens, num_q_heads]
  int64_t partial_values = 0;  // f32 partial outputs: partial_rows x head_dim
  int64_t counters = 0;        // u32 merge counters: [num_tokens, num_q_heads]
  // Grows to hold other's needs too (layers, or batch sizes, that share one workspace).
  void cover(const DecodeWorkspace& other) {
    partial_rows = partial_rows > other.partial_rows ? partial_rows : other.partial_rows;
    partial_values = partial_values > other.partial_values ? partial_values : other.partial_values;
    counters = counters > other.counters ? counters : other.counters;
  }
};

// A selection's answer: supported or not (and why), which kernel, and what the kernel needs.
struct CudaAttentionPlan {
  std::string unsupported_reason;  // empty when supported; else names the value and what is allowed
  CudaAttentionKernel kernel = CudaAttentionKernel::kNone;
  DecodePlan decode;               // kDecode
  DecodeWorkspace workspace;       // kDecode
  int heads_per_group = 0;         // kPrefillWgmma / kPrefillMma: PrefillWork::heads_per_group
  bool supported() const { return unsupported_reason.empty(); }
};

// DECODE steps. Reads page_size, attention_chunk_size and the decode facts.
CudaAttentionPlan select_cuda_decode(const AttentionLayer& layer, DType q_dtype, DType kv_dtype,
                                     const CudaAttentionShape& shape);
// EXTEND, MIXED, DRAFT_EXTEND, and TARGET_VERIFY through the prefill kernels. Reads page_size,
// attention_chunk_size, kv_rows, l2_bytes and custom_mask.
CudaAttentionPlan select_cuda_extend(const AttentionLayer& layer, DType q_dtype, DType kv_dtype,
                                     const CudaAttentionShape& shape);
// forward_draft_tree: the tree kernel or nothing. Reads page_size, attention_chunk_size and
// rows_contiguous.
CudaAttentionPlan select_cuda_draft_tree(const AttentionLayer& layer, DType q_dtype, DType kv_dtype,
                                         const CudaAttentionShape& shape);
// TARGET_VERIFY: the tree kernel where the step staged its arrays and it serves the layer, else the
// prefill kernels over the tree mask. Reads what the two above read, and tree_staged.
CudaAttentionPlan select_cuda_verify(const AttentionLayer& layer, DType q_dtype, DType kv_dtype,
                                     const CudaAttentionShape& shape);
 
// q and out as the tree kernel reads them: [rows, num_q_heads, head_dim] without gaps.
bool dense_rows(const TensorView& t, const AttentionLayer& layer);

}  // namespace specula
