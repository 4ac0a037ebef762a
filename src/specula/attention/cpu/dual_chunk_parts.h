// Dual chunk attention through the CPU backend's own kernels (the tile kernel, and the bf16 decode
// kernel for one-token rows): each run of a sequence's new tokens inside one chunk c attends in
// three passes over three virtual sequences, then the passes merge by their log-sum-exps:
//   intra: keys [c chunk_len, position], causal, q variant 0;
//   successive (c >= 1): keys [(c - 1) chunk_len, c chunk_len), all of them, variant 1;
//   inter (c >= 2): keys [0, (c - 1) chunk_len), all of them, variant 2.
// A virtual sequence is the run's rows over a page-aligned slice of the sequence's page table,
// so chunk_len must be a multiple of the page size (dual_chunk_parts_fit). The long-context
// temperature of each sequence multiplies its queries (an f32 copy) before the passes.
#pragma once

#include <array>
#include <span>
#include <utility>
#include <vector>

#include "specula/attention/cpu/tile_kernel.h"

namespace specula {

class ThreadPool;
struct DualChunkShape;

bool dual_chunk_parts_fit(const CpuAttentionParams& params, const DualChunkShape& shape);

// The three passes' virtual sequences and work plans over a step's sequences: the same for every
// dual chunk layer of the step, so the backend builds it once per step (on the first such layer).
struct DualChunkPassPlan {
  // What it was built for: the layers' chunk length, original length and sparse rows.
  int chunk_len = 0, original_max_position = 0;
  int sparse_threshold = -1;  // -1: no sparse rows
  std::array<std::vector<CpuAttentionSeq>, 3> virt;             // intra, successive, inter
  std::array<CpuAttentionPlan, 3> plans;
  std::array<std::vector<std::pair<int64_t, float>>, 3> rows;   // (token row, its temperature)
  std::vector<int64_t> all_rows;
  int64_t num_rows = 0;  // rows of q / out the sequences reach
  bool built_for(const DualChunkShape& shape) const;
};

// seqs: the sequences the passes serve (a step's dense ones; their pages must outlive the plan).
DualChunkPassPlan plan_dual_chunk_parts(int page_size, int num_q_heads, int num_kv_heads, const DualChunkShape& shape,
                                        std::span<const CpuAttentionSeq> seqs);

// params as run_dual_chunk_attention takes them (q with 3 or 5 variants; only 0-2 are read).
void run_dual_chunk_parts(CpuIsa isa, const CpuAttentionParams& params, const DualChunkPassPlan& plan,
                          std::vector<CpuAttentionScratch>& scratch, ThreadPool& pool);

}  // namespace specula
