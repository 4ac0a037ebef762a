// Dual chunk attention's prefill, extend and mixed steps on the GPU, planned once per step: every
// sequence's new tokens are cut into runs that each lie in one chunk c (of chunk_len keys), and
// each run attends in up to three passes of the prefill kernels over virtual sequences of its
// run's rows, each pass with its own rotary variant of q:
//   0, intra: keys [c chunk_len, its position], causal (the run's rows are the slice's last);
//   1, successive: keys [(c - 1) chunk_len, c chunk_len), all of them (none when c = 0);
//   2, inter: keys [0, (c - 1) chunk_len), all of them (none when c < 2).
// Every pass covers every run (an empty one writes LSE -inf), so all passes share one set of
// query rows and work items, and a kernels/dual_chunk_merge launch joins them by their LSEs. A
// virtual sequence's keys are a page-aligned slice of its sequence's page table, so chunk_len
// must be a multiple of the page size. A step whose runs all lie in chunk 0 needs pass 0 alone,
// which writes the output directly.
//
// With a sparse pattern (attention/cpu/dual_chunk_sparse.h), the runs of a sequence with two or
// more new tokens and more keys than the pattern's threshold are sparse: kernels/dual_chunk_sparse
// picks each one's kept keys per head, and the passes see only those.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "specula/attention/backend.h"
#include "specula/attention/metadata.h"

namespace specula {

struct CudaDualChunkPlan {
  int chunk_len = 0;
  int original_max_position = 0;
  int num_runs = 0;
  int num_parts = 0;                  // 1 + the highest chunk index of a run, at most 3
  std::vector<int32_t> cu_q;          // [num_runs + 1] the runs' query rows
  std::vector<int32_t> items;         // (run, first row) per tile of kPrefillTileRows rows
  std::vector<float> temperature;     // [num_runs] dual_chunk_logit_scale of the run's sequence
  int page_stride = 0;                // of each pass's page table
  std::array<std::vector<int32_t>, 3> kv_lens;  // per pass [num_runs]
  std::array<std::vector<int32_t>, 3> pages;    // per pass [num_runs, page_stride]
  std::array<int64_t, 3> kv_rows{};             // per pass: the keys its runs read
  // Sparse runs: per run its index among them or -1, the absolute position of its first query,
  // and per pass the absolute index of its first key; per sparse run its
  // ck::kSparseRunFields fields and temperature; the longest sparse run's end.
  int num_sparse = 0;
  int sparse_max_end = 0;
  std::vector<int32_t> keep_run, q_base;
  std::array<std::vector<int32_t>, 3> key_base;
  std::vector<int32_t> sparse_runs;
  std::vector<float> sparse_temperature;
};

// q_lens / kv_lens per sequence (queries are each sequence's last rows); table its page table;
// sparse: the layers' pattern, or nullptr.
CudaDualChunkPlan plan_cuda_dual_chunk(int chunk_len, int original_max_position, int page_size,
                                       std::span<const int32_t> q_lens, std::span<const int32_t> kv_lens,
                                       const PageTable& table, const DualChunkSparsePattern* sparse = nullptr);

}  // namespace specula
