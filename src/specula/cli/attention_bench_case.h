// A ready-to-run attention workload for benchmarks: a paged KV pool filled with random values
// (pages handed to requests in shuffled order, as a long-running server's cache looks), a batch,
// random queries, and the figures a report needs (bytes of KV read, FLOPs).
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>

#include "specula/attention/backend.h"
#include "specula/batch/forward_batch.h"
#include "specula/kv/mha_kv_pool.h"
#include "specula/kv/req_to_token_pool.h"

namespace specula {

struct AttentionBenchCase {
  std::string name;
  ForwardMode mode = ForwardMode::DECODE;  // DECODE or EXTEND
  int batch_size = 1;
  int prefix_len = 0;  // cached tokens before the new ones (DECODE: seq_len - 1)
  int extend_len = 1;  // new tokens per request (DECODE: 1)
  int num_q_heads = 32;
  int num_kv_heads = 8;
  int head_dim = 128;
  int page_size = 16;
  DType kv_dtype = DType::bf16;
  DType q_dtype = DType::bf16;
  bool causal = true;
  // Layers whose calls run back to back in one timed step, each over its own cache (so no layer
  // finds another's KV in the L2); figures are per layer. 1: one isolated call.
  int layers = 1;
  // > 0: a dual chunk attention layer: q holds three rotary variants (five with dca_sparse).
  int dca_chunk_len = 0;
  int dca_original_max = 0;
  std::shared_ptr<const DualChunkSparsePattern> dca_sparse;  // the sparse prefill pattern, or none
};

class AttentionBenchSetup {
 public:
  // Builds the pool and buffers on `device` (the batch on the host); `backend` must be built for
  // case.page_size and that device.
  AttentionBenchSetup(const AttentionBenchCase& c, AttentionBackend& backend, Device device = Device::cpu(),
                      uint64_t seed = 1234);

  void init_metadata();  // once per step
  void run_layer(int layer = 0);  // one layer's attention (the KV is already in the cache)

  const AttentionBenchCase& bench_case() const { return case_; }
  const AttentionLayer& layer() const { return layer_; }
  MHAKVPool& kv_pool() const { return *kv_pool_; }
  std::vector<int32_t> cached_slots() const;  // every token slot of every request
  int64_t num_query_tokens() const { return batch_.num_tokens(); }
  double kv_bytes_read() const;      // per layer: every visible K and V row read once per KV head
  double attention_flops() const;    // per layer: 2 * (head_dim + v_head_dim) per visible (query, key, head)

 private:
  AttentionBenchCase case_;
  AttentionBackend& backend_;
  AttentionLayer layer_;
  std::unique_ptr<ReqToTokenPool> req_pool_;
  std::unique_ptr<MHAKVPool> kv_pool_;
  ForwardBatch batch_;
  Buffer q_, k_, v_, out_;
};

}  // namespace specula
