// The EAGLE tree-draft kernels: the draft head's top-k, the tree-expansion bookkeeping, their
// fusions for chains (topk 1), and the chain's greedy verification for the next draft extend.
// Selection is row_top_k.cuh's (deterministic, equal to the CPU's partial_sort). The draft
// head's attention is tree_attention (attention/cuda/kernels/tree_attention.h).
#include <cstdint>
#include <string>

#include "specula/core/cuda_check.h"
#include "specula/core/cuda_pdl.cuh"
#include "specula/speculative/cuda/draft_kernels.h"
#include "specula/speculative/cuda/row_top_k.cuh"

namespace specula::cuda_kernels {

namespace {

constexpr int kTreeThreads = 256;  // >= kMaxDraftTopK^2: one child per thread in draft_select

// One block per row.
template <int KCAP>
__global__ void __launch_bounds__(kTopKMaxThreads) draft_top_k_kernel(const DraftTopKParams p) {
  pdl_wait();
  pdl_trigger();
  __shared__ RowTopKShared<KCAP> sm;
  const int64_t row = blockIdx.x;
  row_top_k<KCAP>(p.logits + row * p.vocab, p.vocab, p.k, sm);
  const int tid = static_cast<int>(threadIdx.x);
  if (tid < p.k) {
    p.tokens[row * p.k + tid] = target_id(p.d2t, sm.best_id[tid]);
    p.probs[row * p.k + tid] = sm.best_v[tid];
  }
}

// ---- draft_init / draft_select ----------------------------------------------------------

// draft_num_candidates for device code (the header's is host-only).
__device__ __forceinline__ int num_candidates(int k, int num_steps) { return k + (num_steps - 1) * k * k; }

// dst row j (of `count`, `width` floats each) = src row src_row(j), by the whole block. One
// flat loop over all rows' elements keeps many independent loads in flight; 16-byte accesses
// when both bases are 16-byte aligned and rows are a multiple of 4 floats (then every row is).
template <typename SrcRow>
__device__ __forceinline__ void block_copy_rows(float* dst, const float* src, int count, int width, SrcRow src_row) {
  const int tid = static_cast<int>(threadIdx.x), nthreads = static_cast<int>(blockDim.x);
  if (width % 4 == 0 && ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15) == 0) {
    const int w4 = width / 4;
    float4* d4 = reinterpret_cast<float4*>(dst);
    const float4* s4 = reinterpret_cast<const float4*>(src);
#pragma unroll 4
    for (int i = tid; i < count * w4; i += nthreads) {
      const int j = i / w4, e = i % w4;
      d4[static_cast<int64_t>(j) * w4 + e] = s4[static_cast<int64_t>(src_row(j)) * w4 + e];
    }
  } else {
    for (int i = tid; i < count * width; i += nthreads) {
      const int j = i / width, e = i % width;
      dst[static_cast<int64_t>(j) * width + e] = src[static_cast<int64_t>(src_row(j)) * width + e];
    }
  }
}

// One block per request.
__global__ void __launch_bounds__(kTreeThreads) draft_init_kernel(const DraftTreeState st, const int32_t* root_tokens,
                                                                  const float* root_probs, const float* root_hidden,
                                                                  const int32_t* root_rows) {
  pdl_wait();
  pdl_trigger();
  const int b = static_cast<int>(blockIdx.x), k = st.k;
  const int64_t root = root_rows != nullptr ? root_rows[b] : b;
  const int64_t cand0 = static_cast<int64_t>(b) * num_candidates(k, st.num_steps);
  const int tid = static_cast<int>(threadIdx.x);
  if (tid < k) {
    const int r = b * k + tid;
    const int32_t token = root_tokens[root * k + tid];
    const float prob = root_probs[root * k + tid];
    st.cand_tokens[cand0 + tid] = token;
    st.cand_parents[cand0 + tid] = -1;
    st.cand_scores[cand0 + tid] = prob;
    st.frontier_scores[r] = prob;
    st.frontier_nodes[r] = tid;
    st.row_tokens[r] = token;
    // Step 1's own slot; with num_steps == 1 no step runs and there is none.
    if (st.num_steps >= 2) st.branch[static_cast<int64_t>(r) * st.num_steps] = st.step_slots[r];
  }
  block_copy_rows(st.row_hidden + static_cast<int64_t>(b) * k * st.hidden, root_hidden + root * st.hidden, k, st.hidden,
                  [](int) { return 0; });
}

// One block per request.
__global__ void __launch_bounds__(kTreeThreads) draft_store_roots_kernel(const DraftRootStore store,
                                                                         const int32_t* store_rows, const float* hidden,
                                                                         const int32_t* tokens, const float* probs) {
  pdl_wait();
  pdl_trigger();
  const int b = static_cast<int>(blockIdx.x), k = store.k;
  const int64_t row = store_rows[b];
  if (row < 0) return;  // a padding request
  const int tid = static_cast<int>(threadIdx.x);
  if (tid < k) {
    store.tokens[row * k + tid] = tokens[static_cast<int64_t>(b) * k + tid];
    store.probs[row * k + tid] = probs[static_cast<int64_t>(b) * k + tid];
  }
  block_copy_rows(store.hidden + row * store.hidden_size, hidden + static_cast<int64_t>(b) * store.hidden_size, 1,
                  store.hidden_size, [](int) { return 0; });
}

// One block per request; child c = j * k + t of the request (j its parent row, t the rank)
// is candidate first + c. Everything read from the old frontier (scores, nodes, branches) is
// read before block_select's barriers and written only after them, because a new row may
// descend from any old row of its request.
template <int KCAP>
__global__ void __launch_bounds__(kTreeThreads)
    draft_select_kernel(const DraftTreeState st, int step, const int32_t* child_tokens, const float* child_probs,
                        const float* step_hidden) {
  pdl_wait();
  pdl_trigger();
  extern __shared__ int32_t sm_branch[];  // [k, step]: the old rows' branches
  __shared__ float sm_v[(kTreeThreads / 32) * KCAP];
  __shared__ int32_t sm_id[(kTreeThreads / 32) * KCAP];
  __shared__ float best_v[KCAP];
  __shared__ int32_t best_id[KCAP];
  const int b = static_cast<int>(blockIdx.x), k = st.k, kk = k * k;
  const int tid = static_cast<int>(threadIdx.x), nthreads = static_cast<int>(blockDim.x);
  const int first = k + (step - 1) * kk;
  const int64_t cand0 = static_cast<int64_t>(b) * num_candidates(k, st.num_steps) + first;
  const int64_t child0 = static_cast<int64_t>(b) * kk;  // a request's children are contiguous

  TopList<KCAP> list;
  list.clear();
  for (int c = tid; c < kk; c += nthreads) {
    const int r = b * k + c / k;
    // __fmul_rn: a plain rounded product, never contracted, as the CPU's float multiply.
    const float score = __fmul_rn(st.frontier_scores[r], child_probs[child0 + c]);
    st.cand_tokens[cand0 + c] = child_tokens[child0 + c];
    st.cand_parents[cand0 + c] = st.frontier_nodes[r];
    st.cand_scores[cand0 + c] = score;
    list.insert(score, c);
  }
  for (int i = tid; i < k * step; i += nthreads) {
    sm_branch[i] = st.branch[static_cast<int64_t>(b * k + i / step) * st.num_steps + i % step];
  }
  block_select(list, k, sm_v, sm_id, best_v, best_id);

  if (tid < k) {
    const int r = b * k + tid;
    const int32_t c = best_id[tid];
    st.frontier_scores[r] = best_v[tid];
    st.frontier_nodes[r] = first + c;
    st.row_tokens[r] = child_tokens[child0 + c];
  }
  // The parent row's path, then (when a step follows) the row's own slot of step + 1.
  const bool next = step + 1 <= st.num_steps - 1;
  const int len = next ? step + 1 : step;
  for (int i = tid; i < k * len; i += nthreads) {
    const int j = i / len, d = i % len;
    const int parent = best_id[j] / k;
    st.branch[static_cast<int64_t>(b * k + j) * st.num_steps + d] =
        d < step ? sm_branch[parent * step + d]
                 : st.step_slots[(static_cast<int64_t>(step) * st.batch + b) * k + j];
  }
  block_copy_rows(st.row_hidden + static_cast<int64_t>(b) * k * st.hidden,
                  step_hidden + static_cast<int64_t>(b) * k * st.hidden, k, st.hidden,
                  [&](int j) { return best_id[j] / k; });
}

// A chain's (topk 1) selection: request b's one child (token, prob) becomes its frontier; the
// row's path keeps its slots and the next step's own slot joins it. By one thread.
__device__ __forceinline__ void top1_select_write(const DraftTreeState& st, int step, int b, int32_t token, float prob) {
  const int first = step;  // k + (step - 1) * k * k with k = 1
  const int64_t cand = static_cast<int64_t>(b) * num_candidates(1, st.num_steps) + first;
  // __fmul_rn: a plain rounded product, never contracted, as the CPU's float multiply.
  const float score = __fmul_rn(st.frontier_scores[b], prob);
  st.cand_tokens[cand] = token;
  st.cand_parents[cand] = st.frontier_nodes[b];
  st.cand_scores[cand] = score;
  st.frontier_scores[b] = score;
  st.frontier_nodes[b] = first;
  st.row_tokens[b] = token;
  if (step + 1 <= st.num_steps - 1) {
    st.branch[static_cast<int64_t>(b) * st.num_steps + step] = st.step_slots[static_cast<int64_t>(step) * st.batch + b];
  }
}

// draft_top_k and draft_select fused for topk 1 (a chain): one block per request, whose one row
// is its frontier. Same row_top_k and thread count as draft_top_k, so the child and its
// probability equal the two-kernel path's bit for bit.
__global__ void __launch_bounds__(kTopKMaxThreads)
    draft_top1_select_kernel(const DraftTreeState st, int step, const float* logits, int vocab, const int64_t* d2t,
                             const float* step_hidden) {
  pdl_wait();
  pdl_trigger();
  __shared__ RowTopKShared<1> sm;
  const int b = static_cast<int>(blockIdx.x);
  row_top_k<1>(logits + static_cast<int64_t>(b) * vocab, vocab, 1, sm);
  if (threadIdx.x == 0) top1_select_write(st, step, b, target_id(d2t, sm.best_id[0]), sm.best_v[0]);
  block_copy_rows(st.row_hidden + static_cast<int64_t>(b) * st.hidden, step_hidden + static_cast<int64_t>(b) * st.hidden, 1,
                  st.hidden, [](int) { return 0; });
}

// One block per verify row: its features; the first row's block also walks the request's chain.
__global__ void __launch_bounds__(kTreeThreads) chain_extend_inputs_kernel(const ChainExtendParams p) {
  pdl_wait();
  pdl_trigger();
  const int row = static_cast<int>(blockIdx.x), n = p.n;
  if (row % n == 0 && threadIdx.x == 0) {
    const int64_t base = row;
    int a = 1;
    while (a < n && p.verify_ids[base + a] == p.greedy[base + a - 1]) ++a;
    // A bonus of -1 (no logit above -inf) fails the cycle on the host; the extend only needs a
    // valid id until then.
    const int32_t bonus = max(p.greedy[base + a - 1], 0);
    for (int q = 0; q < n; ++q) {
      p.ext_ids[base + q] = q == a - 1 ? bonus : (q + 1 < n ? p.verify_ids[base + q + 1] : 0);
    }
    p.last_rows[row / n] = static_cast<int32_t>(base + a - 1);
  }
  block_copy_rows(p.ext_features + static_cast<int64_t>(row) * p.feature_width,
                  p.features + static_cast<int64_t>(row) * p.feature_width, 1, p.feature_width, [](int) { return 0; });
}

void check_tree_state(const DraftTreeState& st, const char* op) {
  SPECULA_REQUIRE(st.batch >= 0 && st.k >= 1 && st.k <= kMaxDraftTopK && st.num_steps >= 1 && st.hidden >= 0,
                  std::string(op) + ": batch " + std::to_string(st.batch) + ", topk " + std::to_string(st.k) +
                      ", num_steps " + std::to_string(st.num_steps) + ", hidden " + std::to_string(st.hidden) +
                      " are not valid; topk must be in [1, " + std::to_string(kMaxDraftTopK) +
                      "] and num_steps >= 1");
}

}  // namespace

void draft_top_k(const DraftTopKParams& p, cudaStream_t s) {
  SPECULA_REQUIRE(p.k >= 1 && p.k <= kMaxDraftTopK && p.vocab >= p.k,
                  "draft_top_k: topk " + std::to_string(p.k) + " over vocab " + std::to_string(p.vocab) +
                      " is not supported; topk must be in [1, " + std::to_string(kMaxDraftTopK) + "] and <= vocab");
  if (p.rows == 0) return;
  const int threads = topk_threads(p.vocab);
  dispatch_kcap(p.k, [&](auto kcap_tag) {
    constexpr int KCAP = decltype(kcap_tag)::value;
    launch_pdl(draft_top_k_kernel<KCAP>, static_cast<unsigned>(p.rows), threads, 0, s, p);
  });
  CUDA_CHECK(cudaGetLastError());
}

void draft_init(const DraftTreeState& st, const int32_t* root_tokens, const float* root_probs, const float* root_hidden,
                const int32_t* root_rows, cudaStream_t s) {
  check_tree_state(st, "draft_init");
  if (st.batch == 0) return;
  launch_pdl(draft_init_kernel, static_cast<unsigned>(st.batch), kTreeThreads, 0, s, st, root_tokens, root_probs,
             root_hidden, root_rows);
  CUDA_CHECK(cudaGetLastError());
}

void draft_store_roots(const DraftRootStore& store, const int32_t* store_rows, int batch, const float* hidden,
                       const int32_t* tokens, const float* probs, cudaStream_t s) {
  SPECULA_REQUIRE(store.k >= 1 && store.k <= kMaxDraftTopK && store.hidden_size >= 0 && batch >= 0,
                  "draft_store_roots: topk " + std::to_string(store.k) + ", hidden " + std::to_string(store.hidden_size) +
                      ", batch " + std::to_string(batch) + " are not valid; topk must be in [1, " +
                      std::to_string(kMaxDraftTopK) + "]");
  if (batch == 0) return;
  launch_pdl(draft_store_roots_kernel, static_cast<unsigned>(batch), kTreeThreads, 0, s, store, store_rows, hidden,
             tokens, probs);
  CUDA_CHECK(cudaGetLastError());
}

void draft_select(const DraftTreeState& st, int step, const int32_t* child_tokens, const float* child_probs,
                  const float* step_hidden, cudaStream_t s) {
  check_tree_state(st, "draft_select");
  SPECULA_REQUIRE(step >= 1 && step <= st.num_steps - 1,
                  "draft_select: step " + std::to_string(step) + " is not valid; it must be in [1, num_steps - 1 = " +
                      std::to_string(st.num_steps - 1) + "]");
  // The kernel reads the old hidden rows of a request while writing the new ones.
  SPECULA_REQUIRE(step_hidden != st.row_hidden, "draft_select: step_hidden must not alias row_hidden");
  if (st.batch == 0) return;
  const size_t smem = static_cast<size_t>(st.k) * static_cast<size_t>(step) * sizeof(int32_t);
  SPECULA_REQUIRE(smem <= 48 * 1024, "draft_select: num_steps " + std::to_string(st.num_steps) + " with topk " +
                                         std::to_string(st.k) + " needs more than 48 KiB of shared memory");
  dispatch_kcap(st.k, [&](auto kcap_tag) {
    constexpr int KCAP = decltype(kcap_tag)::value;
    launch_pdl(draft_select_kernel<KCAP>, static_cast<unsigned>(st.batch), kTreeThreads, smem, s, st, step,
               child_tokens, child_probs, step_hidden);
  });
  CUDA_CHECK(cudaGetLastError());
}

void draft_top1_select(const DraftTreeState& st, int step, const float* logits, int vocab, const int64_t* d2t,
                       const float* step_hidden, cudaStream_t s) {
  check_tree_state(st, "draft_top1_select");
  SPECULA_REQUIRE(st.k == 1 && vocab >= 1 && step >= 1 && step <= st.num_steps - 1,
                  "draft_top1_select: topk " + std::to_string(st.k) + ", vocab " + std::to_string(vocab) + ", step " +
                      std::to_string(step) + " are not valid; it needs topk 1, vocab >= 1 and a step in [1, " +
                      std::to_string(st.num_steps - 1) + "]");
  SPECULA_REQUIRE(step_hidden != st.row_hidden, "draft_top1_select: step_hidden must not alias row_hidden");
  if (st.batch == 0) return;
  launch_pdl(draft_top1_select_kernel, static_cast<unsigned>(st.batch), topk_threads(vocab), 0, s, st, step, logits,
             vocab, d2t, step_hidden);
  CUDA_CHECK(cudaGetLastError());
}

void chain_extend_inputs(const ChainExtendParams& p, cudaStream_t s) {
  SPECULA_REQUIRE(p.batch >= 0 && p.n >= 1 && p.feature_width >= 0,
                  "chain_extend_inputs: batch " + std::to_string(p.batch) + ", num_draft_tokens " + std::to_string(p.n) +
                      ", feature width " + std::to_string(p.feature_width) + " are not valid");
  if (p.batch == 0) return;
  launch_pdl(chain_extend_inputs_kernel, static_cast<unsigned>(p.batch * p.n), kTreeThreads, 0, s, p);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace specula::cuda_kernels
