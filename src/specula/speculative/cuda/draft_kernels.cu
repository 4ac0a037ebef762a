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
// Attention (draft_tree_attention) follows the decode kernel's layout: a block serves one
// (row, kv head) with up to GMAX q heads of the group; "subgroups" of LPK = head_dim / 8 lanes
// own one key at a time, each lane holding 8 consecutive elements of the key's row (16-byte
// bf16 loads, a subgroup reads whole contiguous rows), kUnroll keys deep to keep loads in
// flight. Each subgroup runs its own online softmax; subgroups merge within the warp by
// shuffles, warps through shared memory, always in the same order.
#include <cuda_bf16.h>

#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>

#include "specula/core/cuda_check.h"
#include "specula/speculative/cuda/draft_kernels.h"

namespace specula::cuda_kernels {

namespace {

constexpr float kNegInf = -__builtin_huge_valf();
constexpr float kLog2e = 1.4426950408889634f;
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
                                                                  const float* root_probs, const float* root_hidden) {
  const int b = static_cast<int>(blockIdx.x), k = st.k;
  const int64_t cand0 = static_cast<int64_t>(b) * num_candidates(k, st.num_steps);
  const int tid = static_cast<int>(threadIdx.x);
  if (tid < k) {
    const int r = b * k + tid;
    const int32_t token = root_tokens[r];
    const float prob = root_probs[r];
    st.cand_tokens[cand0 + tid] = token;
    st.cand_parents[cand0 + tid] = -1;
    st.cand_scores[cand0 + tid] = prob;
    st.frontier_scores[r] = prob;
    st.frontier_nodes[r] = tid;
    st.row_tokens[r] = token;
    // Step 1's own slot; with num_steps == 1 no step runs and there is none.
    if (st.num_steps >= 2) st.branch[static_cast<int64_t>(r) * st.num_steps] = st.step_slots[r];
  }
  block_copy_rows(st.row_hidden + static_cast<int64_t>(b) * k * st.hidden,
                  root_hidden + static_cast<int64_t>(b) * st.hidden, k, st.hidden, [](int) { return 0; });
}

// One block per request; child c = j * k + t of the request (j its parent row, t the rank)
// is candidate first + c. Everything read from the old frontier (scores, nodes, branches) is
// read before block_select's barriers and written only after them, because a new row may
// descend from any old row of its request.
template <int KCAP>
__global__ void __launch_bounds__(kTreeThreads)
    draft_select_kernel(const DraftTreeState st, int step, const int32_t* child_tokens, const float* child_probs,
                        const float* step_hidden) {
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

// ---- draft_tree_attention ---------------------------------------------------------------

constexpr int kEpl = 8;  // bf16 elements per lane per row: one 16-byte load

__device__ __forceinline__ void unpack_bf16x8(const uint4& raw, float (&dst)[kEpl]) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    dst[2 * i] = __uint_as_float(words[i] << 16);
    dst[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (lo) in the low half
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Online-softmax state merge (m in log2 units). Written without contraction so that the two
// lanes of a butterfly compute bit-identical results from swapped operands. Both empty (m =
// -inf) stays empty instead of producing exp2(-inf - -inf) = NaN.
__device__ __forceinline__ void merge_state(float& m, float& l, float (&o)[kEpl], float mo, float lo,
                                            const float (&oo)[kEpl]) {
  const float mn = fmaxf(m, mo);
  if (mn == kNegInf) return;
  const float a = exp2f(m - mn), c = exp2f(mo - mn);  // an empty side gets weight 0
  l = __fadd_rn(__fmul_rn(l, a), __fmul_rn(lo, c));
#pragma unroll
  for (int e = 0; e < kEpl; ++e) o[e] = __fadd_rn(__fmul_rn(o[e], a), __fmul_rn(oo[e], c));
  m = mn;
}

template <int HEAD_DIM>
struct AttnConfig {
  static constexpr int kLpk = HEAD_DIM / kEpl;  // lanes per key
  // Shared memory holds a state per (warp, q head): 4 warps at head_dim 256 keep it < 48 KiB.
  static constexpr int kThreads = HEAD_DIM == 256 ? 128 : 256;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kSubgroups = kWarps * (32 / kLpk);
};

template <int HEAD_DIM, int GMAX>
__global__ void __launch_bounds__(AttnConfig<HEAD_DIM>::kThreads) draft_attention_kernel(const DraftAttentionParams p) {
  using Cfg = AttnConfig<HEAD_DIM>;
  constexpr int LPK = Cfg::kLpk, kSubgroups = Cfg::kSubgroups, kWarps = Cfg::kWarps;
  constexpr int kUnroll = GMAX >= 8 ? 2 : 4;  // keys per subgroup per iteration; fewer where q/o take the registers
  __shared__ float sm_m[kWarps][GMAX];
  __shared__ float sm_l[kWarps][GMAX];
  __shared__ __align__(16) float sm_o[kWarps][GMAX][HEAD_DIM];

  const int r = static_cast<int>(blockIdx.x);
  const int group = p.num_q_heads / p.num_kv_heads;
  const int head_blocks = (group + GMAX - 1) / GMAX;
  const int kv_head = static_cast<int>(blockIdx.y) / head_blocks;
  const int head_block = static_cast<int>(blockIdx.y) % head_blocks;
  const int head0 = kv_head * group + head_block * GMAX;
  const int num_heads = min(GMAX, group - head_block * GMAX);
  const int req = r / p.k;
  const int prefix_len = p.prefix_lens[req];
  const int total = prefix_len + p.branch_len;

  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int subgroup = warp * (32 / LPK) + lane / LPK;
  const int d0 = (lane % LPK) * kEpl;

  // q with scale and log2(e) folded in, so scores are in log2 units for exp2f.
  const __nv_bfloat16* q = static_cast<const __nv_bfloat16*>(p.q);
  const float q_mul = p.scale * kLog2e;
  float qf[GMAX][kEpl];
#pragma unroll
  for (int h = 0; h < GMAX; ++h) {
    if (h < num_heads) {
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(
          q + (static_cast<int64_t>(r) * p.num_q_heads + head0 + h) * HEAD_DIM + d0));
      unpack_bf16x8(raw, qf[h]);
#pragma unroll
      for (int e = 0; e < kEpl; ++e) qf[h][e] *= q_mul;
    } else {
#pragma unroll
      for (int e = 0; e < kEpl; ++e) qf[h][e] = 0.0f;
    }
  }
  float m[GMAX], l[GMAX], o[GMAX][kEpl];
#pragma unroll
  for (int h = 0; h < GMAX; ++h) {
    m[h] = kNegInf;
    l[h] = 0.0f;
#pragma unroll
    for (int e = 0; e < kEpl; ++e) o[h][e] = 0.0f;
  }

  const int32_t* pages = p.prefix_pages + static_cast<int64_t>(req) * p.page_stride;
  const int32_t* branch = p.branch + static_cast<int64_t>(r) * p.branch_stride;
  const __nv_bfloat16* k_cache = static_cast<const __nv_bfloat16*>(p.k_cache);
  const __nv_bfloat16* v_cache = static_cast<const __nv_bfloat16*>(p.v_cache);
  // The trip count is uniform across the block: the shuffles below need every lane.
  for (int base = 0; base < total; base += kSubgroups * kUnroll) {
    uint4 k_raw[kUnroll], v_raw[kUnroll];
    bool valid[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int t = base + u * kSubgroups + subgroup;
      valid[u] = t < total;
      int64_t slot = 0;
      if (t < prefix_len) {
        slot = static_cast<int64_t>(pages[t / p.page_size]) * p.page_size + t % p.page_size;
      } else if (valid[u]) {
        slot = branch[t - prefix_len];
      }
      const int64_t offset = (slot * p.num_kv_heads + kv_head) * HEAD_DIM + d0;
      k_raw[u] = valid[u] ? __ldg(reinterpret_cast<const uint4*>(k_cache + offset)) : make_uint4(0, 0, 0, 0);
      v_raw[u] = valid[u] ? __ldg(reinterpret_cast<const uint4*>(v_cache + offset)) : make_uint4(0, 0, 0, 0);
    }
    float s[kUnroll][GMAX];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float kf[kEpl];
      unpack_bf16x8(k_raw[u], kf);
#pragma unroll
      for (int h = 0; h < GMAX; ++h) {
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < kEpl; ++e) dot = fmaf(qf[h][e], kf[e], dot);
        // Butterfly within the subgroup: every lane of it ends with the same sum.
#pragma unroll
        for (int off = LPK / 2; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
        s[u][h] = valid[u] ? dot : kNegInf;
      }
    }
#pragma unroll
    for (int h = 0; h < GMAX; ++h) {
      float m_new = m[h];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) m_new = fmaxf(m_new, s[u][h]);
      if (m_new == kNegInf) continue;  // no key yet for this subgroup
      const float alpha = exp2f(m[h] - m_new);  // m = -inf gives 0
      l[h] *= alpha;
#pragma unroll
      for (int e = 0; e < kEpl; ++e) o[h][e] *= alpha;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const float pu = exp2f(s[u][h] - m_new);  // an invalid key gives 0
        l[h] += pu;
        float vf[kEpl];
        unpack_bf16x8(v_raw[u], vf);
#pragma unroll
        for (int e = 0; e < kEpl; ++e) o[h][e] = fmaf(pu, vf[e], o[h][e]);
      }
      m[h] = m_new;
    }
  }

  // Subgroups of a warp: lanes holding the same columns are LPK apart.
#pragma unroll
  for (int off = LPK; off < 32; off <<= 1) {
#pragma unroll
    for (int h = 0; h < GMAX; ++h) {
      const float mo = __shfl_xor_sync(0xffffffffu, m[h], off);
      const float lo = __shfl_xor_sync(0xffffffffu, l[h], off);
      float oo[kEpl];
#pragma unroll
      for (int e = 0; e < kEpl; ++e) oo[e] = __shfl_xor_sync(0xffffffffu, o[h][e], off);
      merge_state(m[h], l[h], o[h], mo, lo, oo);
    }
  }
  if (lane < LPK) {
#pragma unroll
    for (int h = 0; h < GMAX; ++h) {
      if (lane == 0) {
        sm_m[warp][h] = m[h];
        sm_l[warp][h] = l[h];
      }
#pragma unroll
      for (int e = 0; e < kEpl; ++e) sm_o[warp][h][d0 + e] = o[h][e];
    }
  }
  __syncthreads();

  // Warps in a fixed order; each thread finishes 8 columns of one head and stores 16 bytes.
  __nv_bfloat16* out = static_cast<__nv_bfloat16*>(p.out);
  for (int idx = static_cast<int>(threadIdx.x); idx < num_heads * LPK; idx += Cfg::kThreads) {
    const int h = idx / LPK, c0 = (idx % LPK) * kEpl;
    float mx = kNegInf;
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, sm_m[w][h]);
    float sum_l = 0.0f, acc[kEpl] = {};
    if (mx != kNegInf) {
      for (int w = 0; w < kWarps; ++w) {
        const float wgt = exp2f(sm_m[w][h] - mx);
        sum_l += wgt * sm_l[w][h];
#pragma unroll
        for (int e = 0; e < kEpl; ++e) acc[e] += wgt * sm_o[w][h][c0 + e];
      }
    }
    // No key at all (empty prefix and branch) gives zeros rather than 0/0.
    const float inv = sum_l > 0.0f ? 1.0f / sum_l : 0.0f;
    uint4 packed;
    packed.x = pack_bf16x2(acc[0] * inv, acc[1] * inv);
    packed.y = pack_bf16x2(acc[2] * inv, acc[3] * inv);
    packed.z = pack_bf16x2(acc[4] * inv, acc[5] * inv);
    packed.w = pack_bf16x2(acc[6] * inv, acc[7] * inv);
    *reinterpret_cast<uint4*>(out + (static_cast<int64_t>(r) * p.num_q_heads + head0 + h) * HEAD_DIM + c0) = packed;
  }
}

template <int HEAD_DIM>
void launch_attention(const DraftAttentionParams& p, cudaStream_t s) {
  const int group = p.num_q_heads / p.num_kv_heads;
  auto run = [&](auto gmax_tag) {
    constexpr int GMAX = decltype(gmax_tag)::value;
    const int head_blocks = (group + GMAX - 1) / GMAX;
    const dim3 grid(static_cast<unsigned>(p.rows), static_cast<unsigned>(p.num_kv_heads * head_blocks));
    draft_attention_kernel<HEAD_DIM, GMAX><<<grid, AttnConfig<HEAD_DIM>::kThreads, 0, s>>>(p);
  };
  if (group <= 1) run(std::integral_constant<int, 1>{});
  else if (group <= 2) run(std::integral_constant<int, 2>{});
  else if (group <= 4) run(std::integral_constant<int, 4>{});
  else run(std::integral_constant<int, 8>{});  // larger groups take several blocks per kv head
  CUDA_CHECK(cudaGetLastError());
}

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15) == 0; }

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
    draft_top_k_kernel<KCAP><<<static_cast<unsigned>(p.rows), threads, 0, s>>>(p);
  });
  CUDA_CHECK(cudaGetLastError());
}

void draft_init(const DraftTreeState& st, const int32_t* root_tokens, const float* root_probs, const float* root_hidden,
                cudaStream_t s) {
  check_tree_state(st, "draft_init");
  if (st.batch == 0) return;
  draft_init_kernel<<<static_cast<unsigned>(st.batch), kTreeThreads, 0, s>>>(st, root_tokens, root_probs, root_hidden);
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
    draft_select_kernel<KCAP><<<static_cast<unsigned>(st.batch), kTreeThreads, smem, s>>>(st, step, child_tokens,
                                                                                          child_probs, step_hidden);
  });
  CUDA_CHECK(cudaGetLastError());
}

void draft_tree_attention(const DraftAttentionParams& p, cudaStream_t s) {
  SPECULA_REQUIRE(p.head_dim == 64 || p.head_dim == 128 || p.head_dim == 256,
                  "draft_tree_attention: head_dim " + std::to_string(p.head_dim) +
                      " is not supported; supported: 64, 128, 256");
  SPECULA_REQUIRE(p.num_kv_heads >= 1 && p.num_q_heads >= p.num_kv_heads && p.num_q_heads % p.num_kv_heads == 0,
                  "draft_tree_attention: num_q_heads " + std::to_string(p.num_q_heads) +
                      " must be a positive multiple of num_kv_heads " + std::to_string(p.num_kv_heads));
  SPECULA_REQUIRE(p.k >= 1 && p.rows >= 0 && p.page_size >= 1 && p.branch_len >= 0 && p.branch_len <= p.branch_stride,
                  "draft_tree_attention: rows " + std::to_string(p.rows) + ", topk " + std::to_string(p.k) +
                      ", page_size " + std::to_string(p.page_size) + ", branch_len " + std::to_string(p.branch_len) +
                      " (stride " + std::to_string(p.branch_stride) + ") are not valid");
  // 16-byte row loads and stores.
  SPECULA_REQUIRE(aligned16(p.q) && aligned16(p.k_cache) && aligned16(p.v_cache) && aligned16(p.out),
                  "draft_tree_attention: q, k_cache, v_cache and out must be 16-byte aligned");
  if (p.rows == 0) return;
  if (p.head_dim == 64) launch_attention<64>(p, s);
  else if (p.head_dim == 128) launch_attention<128>(p, s);
  else launch_attention<256>(p, s);
}

}  // namespace specula::cuda_kernels
