// The EAGLE tree-draft kernels.
//
// Selection (draft_top_k, draft_select) uses one scheme: each thread keeps a sorted top-KCAP
// list in registers (KCAP = k rounded up to a power of two, so the list is fully unrolled and
// never touches local memory), each warp extracts its best k by k rounds of a shuffle arg-max,
// and warp 0 does the same over the warps' lists. The order is BetterScore's: higher value
// first, equal values to the lower index. It is a strict total order on distinct indices, so
// every lane of a butterfly agrees on the winner and the result does not depend on the thread
// count: the selection is deterministic and equals the CPU's partial_sort.
//
// The draft head's attention is tree_attention (attention/cuda/kernels/tree_attention.h).
#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>

#include "specula/core/cuda_check.h"
#include "specula/core/cuda_pdl.cuh"
#include "specula/speculative/cuda/draft_kernels.h"

namespace specula::cuda_kernels {

namespace {

constexpr float kNegInf = -__builtin_huge_valf();
constexpr int kTopKMaxThreads = 512;
constexpr int kTreeThreads = 256;  // >= kMaxDraftTopK^2: one child per thread in draft_select

// ---- selection helpers ------------------------------------------------------------------

// BetterScore: a before b.
__device__ __forceinline__ bool better(float va, int32_t ia, float vb, int32_t ib) {
  return va != vb ? va > vb : ia < ib;
}

// A sorted (best first) list of KCAP (value, index) pairs; empty entries are (-inf, INT_MAX),
// worse than any real entry.
template <int KCAP>
struct TopList {
  float v[KCAP];
  int32_t id[KCAP];

  __device__ __forceinline__ void clear() {
#pragma unroll
    for (int i = 0; i < KCAP; ++i) {
      v[i] = kNegInf;
      id[i] = INT_MAX;
    }
  }

  __device__ __forceinline__ void insert(float x, int32_t i) {
    if (!better(x, i, v[KCAP - 1], id[KCAP - 1])) return;
    v[KCAP - 1] = x;
    id[KCAP - 1] = i;
#pragma unroll
    for (int j = KCAP - 1; j > 0; --j) {
      if (better(v[j], id[j], v[j - 1], id[j - 1])) {
        const float tv = v[j];
        v[j] = v[j - 1];
        v[j - 1] = tv;
        const int32_t ti = id[j];
        id[j] = id[j - 1];
        id[j - 1] = ti;
      }
    }
  }

  __device__ __forceinline__ void pop_front() {
#pragma unroll
    for (int j = 0; j + 1 < KCAP; ++j) {
      v[j] = v[j + 1];
      id[j] = id[j + 1];
    }
    v[KCAP - 1] = kNegInf;
    id[KCAP - 1] = INT_MAX;
  }
};

// The warp's best k of its lanes' lists, best first, written by lane 0 to out_v/out_id[0..k).
// Indices are unique across lanes (each element lives in one list), so exactly one lane pops
// per round; only empty entries share INT_MAX, and popping those changes nothing.
template <int KCAP>
__device__ __forceinline__ void warp_select(TopList<KCAP>& list, int k, float* out_v, int32_t* out_id) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  for (int round = 0; round < k; ++round) {
    float bv = list.v[0];
    int32_t bi = list.id[0];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
      const int32_t oi = __shfl_xor_sync(0xffffffffu, bi, off);
      if (better(ov, oi, bv, bi)) {
        bv = ov;
        bi = oi;
      }
    }
    if (list.id[0] == bi) list.pop_front();
    if (lane == 0) {
      out_v[round] = bv;
      out_id[round] = bi;
    }
  }
}

// The block's best k (k <= KCAP) into out_v/out_id (shared memory), visible to every thread on
// return. blockDim.x must be a multiple of 32; sm_v/sm_id hold (blockDim.x / 32) * KCAP entries.
template <int KCAP>
__device__ void block_select(TopList<KCAP>& list, int k, float* sm_v, int32_t* sm_id, float* out_v, int32_t* out_id) {
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int warps = static_cast<int>(blockDim.x) >> 5;
  warp_select(list, k, sm_v + warp * KCAP, sm_id + warp * KCAP);
  __syncthreads();
  if (warp == 0) {
    TopList<KCAP> merged;
    merged.clear();
    if (lane < warps) {
#pragma unroll
      for (int i = 0; i < KCAP; ++i) {
        if (i < k) {
          merged.v[i] = sm_v[lane * KCAP + i];
          merged.id[i] = sm_id[lane * KCAP + i];
        }
      }
    }
    warp_select(merged, k, out_v, out_id);
  }
  __syncthreads();
}

// Block reductions in a fixed order (deterministic); sm holds 32 entries and may be reused
// right after return.
__device__ float block_max(float v, float* sm) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  if (lane == 0) sm[warp] = v;
  __syncthreads();
  float total = kNegInf;
  for (int i = 0; i < static_cast<int>(blockDim.x >> 5); ++i) total = fmaxf(total, sm[i]);
  __syncthreads();
  return total;
}

__device__ double block_sum(double v, double* sm) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  if (lane == 0) sm[warp] = v;
  __syncthreads();
  double total = 0.0;
  for (int i = 0; i < static_cast<int>(blockDim.x >> 5); ++i) total += sm[i];
  __syncthreads();
  return total;
}

// Runs f(std::integral_constant<int, KCAP>) for the smallest power of two KCAP >= k.
template <typename F>
void dispatch_kcap(int k, F&& f) {
  if (k <= 1) f(std::integral_constant<int, 1>{});
  else if (k <= 2) f(std::integral_constant<int, 2>{});
  else if (k <= 4) f(std::integral_constant<int, 4>{});
  else if (k <= 8) f(std::integral_constant<int, 8>{});
  else f(std::integral_constant<int, 16>{});
}

// ---- draft_top_k ------------------------------------------------------------------------

// One block per row, three passes over the row (the max, the sum, then p and the local lists);
// the later passes hit L2. p = float(double(e) / sum) with e = expf(l - max), as
// EagleWorker::top_k computes it, so equal logits give equal p and fall to the lower id. The
// sum is Kahan-compensated f32 per thread (f64 conversions cost more than the pass itself),
// f64 across threads.
template <int KCAP>
__global__ void __launch_bounds__(kTopKMaxThreads) draft_top_k_kernel(const DraftTopKParams p) {
  pdl_wait();
  pdl_trigger();
  __shared__ float sm_f[32];
  __shared__ double sm_d[32];
  __shared__ float sm_v[(kTopKMaxThreads / 32) * KCAP];
  __shared__ int32_t sm_id[(kTopKMaxThreads / 32) * KCAP];
  __shared__ float best_v[KCAP];
  __shared__ int32_t best_id[KCAP];
  const int64_t row = blockIdx.x;
  const float* logits = p.logits + row * p.vocab;
  const int tid = static_cast<int>(threadIdx.x), nthreads = static_cast<int>(blockDim.x);

  float mx = kNegInf;
  for (int i = tid; i < p.vocab; i += nthreads) mx = fmaxf(mx, logits[i]);
  mx = block_max(mx, sm_f);
  float part = 0.0f, comp = 0.0f;
  for (int i = tid; i < p.vocab; i += nthreads) {
    const float y = expf(logits[i] - mx) - comp;
    const float t = part + y;
    comp = (t - part) - y;
    part = t;
  }
  const double sum = block_sum(static_cast<double>(part), sm_d);

  // Screen before the f64 division: e * inv_sum is within a few ulps (or a subnormal step) of
  // the exact p, so an element clearly below the list's last entry cannot enter it. The margin
  // (1e-5 relative, 1e-44 absolute) is far wider than that error; an empty last entry (-inf)
  // lets everything through.
  const float inv_sum = static_cast<float>(1.0 / sum);
  TopList<KCAP> list;
  list.clear();
  for (int i = tid; i < p.vocab; i += nthreads) {
    const float e = expf(logits[i] - mx);
    if (e * inv_sum < list.v[KCAP - 1] * 0.99999f - 1e-44f) continue;
    list.insert(static_cast<float>(static_cast<double>(e) / sum), i);
  }
  block_select(list, p.k, sm_v, sm_id, best_v, best_id);
  if (tid < p.k) {
    const int32_t id = best_id[tid];
    const int64_t target = p.d2t != nullptr ? id + p.d2t[id] : id;
    p.tokens[row * p.k + tid] = static_cast<int32_t>(target);
    p.probs[row * p.k + tid] = best_v[tid];
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
  // Wide rows get more threads so one row is not a long serial loop; narrow ones fewer, so
  // that the merge does not dominate.
  const int threads = p.vocab >= 8192 ? kTopKMaxThreads : (p.vocab >= 1024 ? 256 : 128);
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
}  // namespace specula::cuda_kernels
