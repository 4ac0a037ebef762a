// Double sparsity's GPU kernels (raw pointers, one stream, no sync): label writes, and the sparse
// decode in two launches (the choice: label scores and an exact top-k per request and KV head, in
// thread-block clusters; attention over the chosen tokens in splits, merged by the row's last
// split). The semantics are DoubleSparsityBackend's (see ds_backend.h); the CPU path there is the
// reference they are tested against.
#pragma once

#include <cstdint>

namespace specula::ds_cuda {

// labels[h, slot, c] = k_cache[slot, h, channels[h * C + c]] for the n slots listed. The GPU keeps
// labels head-major: a page's consecutive slots then have consecutive label rows for one head,
// so the choice's warps read whole cache lines (slot-major rows of 32 bytes, 256 bytes apart at 8
// KV heads, made every lane of a load its own line).
struct LabelWrite {
  const void* k_cache = nullptr;  // [slots, kv_heads, head_dim], 16-bit
  void* labels = nullptr;         // [kv_heads, label_slots, C], the cache's dtype
  const int32_t* slots = nullptr; // [n]
  const int32_t* channels = nullptr;
  int64_t n = 0;
  int64_t label_slots = 0;
  int kv_heads = 0, head_dim = 0, channels_per_head = 0;
};
void write_labels(const LabelWrite& p, void* stream);

struct SparseDecode {
  const void* q = nullptr;                  // [batch, q_heads, head_dim]
  const void* k_cache = nullptr;            // [slots, kv_heads, head_dim]
  const void* v_cache = nullptr;
  const void* labels = nullptr;             // [kv_heads, label_slots, C]
  int64_t label_slots = 0;
  const int32_t* channels = nullptr;        // [kv_heads * C]
  const int32_t* pages = nullptr;           // [batch, max_pages]
  const int32_t* kv_lens = nullptr;         // [batch]
  const float* sinks = nullptr;             // [q_heads] or nullptr
  void* out = nullptr;                      // [batch, q_heads, head_dim], q's dtype
  float* lse = nullptr;                     // [batch, q_heads] or nullptr
  bool f16 = false;                         // q, caches and labels are f16 (else bf16)
  int batch = 0, q_heads = 0, kv_heads = 0, head_dim = 0, channels_per_head = 0;
  int max_pages = 0, page_size = 1, max_kv_len = 0;
  int heavy_token_num = 0, sparse_decode_threshold = 0;
  float scale = 1.0f, logit_cap = 0.0f;
  // Workspace (sparse_decode_workspace sizes it).
  float* scores = nullptr;       // [batch * kv_heads, max_kv_len] when rows overflow shared memory
  int32_t* selected = nullptr;   // [batch * kv_heads, heavy_token_num]: the chosen cache rows
  float* partial = nullptr;      // [batch * kv_heads, splits, group, head_dim + 2]
  int32_t* counters = nullptr;   // [batch * kv_heads], zero before the first call (each call leaves them so)
  int splits = 1;
  int num_sms = 1;
};

// What SparseDecode's workspace needs, in floats / int32s; splits is chosen here.
struct SparseDecodeWorkspace {
  int64_t scores = 0, selected = 0, partial = 0, counters = 0;
  int splits = 1;
};
SparseDecodeWorkspace sparse_decode_workspace(int batch, int q_heads, int kv_heads, int head_dim, int max_kv_len,
                                              int heavy_token_num, int sparse_decode_threshold, int num_sms);

// Empty when the shape is served, else why not (head_dim a multiple of 32 up to 256, at most 8
// query heads per KV head, at most 128 label channels).
const char* sparse_decode_problem(int q_heads, int kv_heads, int head_dim, int channels_per_head);

void sparse_decode(const SparseDecode& p, void* stream);

}  // namespace specula::ds_cuda
