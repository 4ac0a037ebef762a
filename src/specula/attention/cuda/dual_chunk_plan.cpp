#include "specula/attention/cuda/dual_chunk_plan.h"

#include <algorithm>

#include "specula/attention/cpu/dual_chunk.h"
#include "specula/attention/cuda/kernels/attention_params.h"
#include "specula/attention/cuda/kernels/dual_chunk_sparse.h"
#include "specula/core/error.h"

namespace specula {

CudaDualChunkPlan plan_cuda_dual_chunk(int chunk_len, int original_max_position, int page_size,
                                       std::span<const int32_t> q_lens, std::span<const int32_t> kv_lens,
                                       const PageTable& table, const DualChunkSparsePattern* sparse) {
  SPECULA_CHECK(chunk_len > 0 && chunk_len % page_size == 0,
                "dual chunk attention's chunk length {} must be a positive multiple of page_size {} on the cuda backend",
                chunk_len, page_size);
  SPECULA_CHECK(sparse == nullptr || (sparse->last_q >= 1 && sparse->last_q <= cuda_kernels::kMaxSparseEstimators),
                "dual chunk attention's sparse_attention_last_q {} is not supported on the cuda backend; 1 to {}",
                sparse != nullptr ? sparse->last_q : 0, cuda_kernels::kMaxSparseEstimators);
  CudaDualChunkPlan plan;
  const int cl = chunk_len;
  plan.chunk_len = cl;
  plan.original_max_position = original_max_position;
  plan.page_stride = std::max(1, table.max_pages);
  struct Run {
    int seq, begin, end, chunk;  // KV indices [begin, end) of the run's rows, in chunk `chunk`
  };
  std::vector<Run> runs;
  for (size_t i = 0; i < q_lens.size(); ++i) {
    const int q_len = q_lens[i], kv_len = kv_lens[i];
    for (int begin = kv_len - q_len; begin < kv_len;) {
      const int c = begin / cl;
      const int end = std::min(kv_len, (c + 1) * cl);
      runs.push_back({static_cast<int>(i), begin, end, c});
      plan.num_parts = std::max(plan.num_parts, std::min(c, 2) + 1);
      begin = end;
    }
  }
  plan.num_runs = static_cast<int>(runs.size());
  plan.cu_q.push_back(0);
  for (const Run& r : runs) plan.cu_q.push_back(plan.cu_q.back() + (r.end - r.begin));
  for (int v = 0; v < plan.num_runs; ++v) {
    for (int q = 0; q < runs[static_cast<size_t>(v)].end - runs[static_cast<size_t>(v)].begin;
         q += cuda_kernels::kPrefillTileRows) {
      plan.items.push_back(v);
      plan.items.push_back(q);
    }
  }
  for (int v = 0; v < plan.num_runs; ++v) {
    const Run& r = runs[static_cast<size_t>(v)];
    const size_t seq = static_cast<size_t>(r.seq);
    plan.q_base.push_back(r.begin);
    const bool is_sparse = sparse != nullptr && q_lens[seq] >= 2 && kv_lens[seq] > sparse->threshold;
    plan.keep_run.push_back(is_sparse ? plan.num_sparse : -1);
    if (!is_sparse) continue;
    const int count = std::min(r.end - r.begin, sparse->last_q);
    const int32_t fields[cuda_kernels::kSparseRunFields] = {plan.cu_q[static_cast<size_t>(v)] + (r.end - count - r.begin),
                                                            r.end - count, count, r.end, r.chunk, r.seq};
    plan.sparse_runs.insert(plan.sparse_runs.end(), std::begin(fields), std::end(fields));
    plan.sparse_temperature.push_back(static_cast<float>(dual_chunk_logit_scale(kv_lens[seq], original_max_position)));
    plan.sparse_max_end = std::max(plan.sparse_max_end, r.end);
    ++plan.num_sparse;
  }
  for (const Run& r : runs) {
    plan.temperature.push_back(
        static_cast<float>(dual_chunk_logit_scale(kv_lens[static_cast<size_t>(r.seq)], original_max_position)));
  }
  for (int part = 0; part < plan.num_parts; ++part) {
    std::vector<int32_t>& lens = plan.kv_lens[static_cast<size_t>(part)];
    std::vector<int32_t>& pages = plan.pages[static_cast<size_t>(part)];
    pages.assign(static_cast<size_t>(plan.num_runs) * plan.page_stride, 0);
    for (int v = 0; v < plan.num_runs; ++v) {
      const Run& r = runs[static_cast<size_t>(v)];
      int key_begin = 0, key_end = 0;
      if (part == 0) {
        key_begin = r.chunk * cl;
        key_end = r.end;
      } else if (part == 1 && r.chunk >= 1) {
        key_begin = (r.chunk - 1) * cl;
        key_end = r.chunk * cl;
      } else if (part == 2 && r.chunk >= 2) {
        key_end = (r.chunk - 1) * cl;
      }
      lens.push_back(key_end - key_begin);
      plan.key_base[static_cast<size_t>(part)].push_back(key_begin);
      plan.kv_rows[static_cast<size_t>(part)] += key_end - key_begin;
      const int first = key_begin / page_size, count = (key_end - key_begin + page_size - 1) / page_size;
      std::copy(table.row(r.seq) + first, table.row(r.seq) + first + count,
                pages.begin() + static_cast<int64_t>(v) * plan.page_stride);
    }
  }
  return plan;
}

}  // namespace specula
