// Double sparsity's kernels (ds_kernels.h): label writes, label scores, an exact radix top-k per
// (request, KV head), attention over the chosen keys in splits, and the split merge.
#include "specula/attention/double_sparsity/ds_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "specula/core/cuda_check.h"
#include "specula/core/cuda_smem.h"

namespace specula::ds_cuda {
namespace {

constexpr int kWarps = 4;             // attention block
constexpr int kTopKThreads = 1024;    // one block per selected row
constexpr int kCachedKeys = 40960;    // keys a top-k block keeps in shared memory (160 KiB)
constexpr int kMaxGroup = 8;
constexpr int kMaxChannels = 128;

__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }

__device__ __forceinline__ bool row_is_sparse(int len, const SparseDecode& p) {
  return len >= p.sparse_decode_threshold && len > p.heavy_token_num;
}

__device__ __forceinline__ int slot_of(const SparseDecode& p, int b, int j) {
  return p.pages[static_cast<int64_t>(b) * p.max_pages + j / p.page_size] * p.page_size + j % p.page_size;
}

// A float's bits as an unsigned key of the same order (larger float, larger key).
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

template <typename T>
__global__ void write_labels_kernel(LabelWrite p) {
  const int64_t per_slot = static_cast<int64_t>(p.kv_heads) * p.channels_per_head;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= p.n * per_slot) return;
  const int64_t i = idx / per_slot;
  const int hc = static_cast<int>(idx % per_slot);
  const int h = hc / p.channels_per_head;
  const int64_t slot = p.slots[i];
  const T* k = static_cast<const T*>(p.k_cache) + (slot * p.kv_heads + h) * p.head_dim;
  static_cast<T*>(p.labels)[slot * per_slot + hc] = k[p.channels[hc]];
}

// scores[row, j] = sum_c q_label[c] * label[slot(j), h, c] for the rows that go sparse.
template <typename T>
__global__ void label_scores_kernel(SparseDecode p) {
  const int row = blockIdx.y;
  const int b = row / p.kv_heads, h = row % p.kv_heads;
  const int len = p.kv_lens[b];
  if (!row_is_sparse(len, p)) return;
  const int G = p.q_heads / p.kv_heads, C = p.channels_per_head;
  __shared__ float q_label[kMaxChannels];
  const T* q = static_cast<const T*>(p.q) + (static_cast<int64_t>(b) * p.q_heads + h * G) * p.head_dim;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const int channel = p.channels[h * C + c];
    float s = 0.0f;
    for (int g = 0; g < G; ++g) s += to_float(q[g * p.head_dim + channel]);
    q_label[c] = s;
  }
  __syncthreads();
  const T* labels = static_cast<const T*>(p.labels);
  float* scores = p.scores + static_cast<int64_t>(row) * p.max_kv_len;
  for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < len; j += gridDim.x * blockDim.x) {
    const T* lab = labels + (static_cast<int64_t>(slot_of(p, b, j)) * p.kv_heads + h) * C;
    float s = 0.0f;
    if (C % 8 == 0) {
      for (int c0 = 0; c0 < C; c0 += 8) {
        const uint4 raw = *reinterpret_cast<const uint4*>(lab + c0);
        const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int e = 0; e < 8; ++e) s += q_label[c0 + e] * to_float(v[e]);
      }
    } else {
      for (int c = 0; c < C; ++c) s += q_label[c] * to_float(lab[c]);
    }
    scores[j] = s;
  }
}

// The heavy_token_num largest scores of a sparse row, ties to the lower index, listed in index
// order: a radix select of the k-th largest key (11 + 11 + 10 bits), then an ordered compaction.
__global__ void __launch_bounds__(kTopKThreads) top_k_kernel(SparseDecode p, int cache_keys) {
  extern __shared__ uint32_t cached[];
  __shared__ int hist[2048];
  __shared__ int warp_counts[32];
  __shared__ int warp_equal[32];
  __shared__ uint32_t found_prefix;
  __shared__ int found_remaining;
  const int row = blockIdx.x;
  const int b = row / p.kv_heads;
  const int len = p.kv_lens[b];
  if (!row_is_sparse(len, p)) return;
  const float* scores = p.scores + static_cast<int64_t>(row) * p.max_kv_len;
  const bool use_cache = len <= cache_keys;
  if (use_cache) {
    for (int j = threadIdx.x; j < len; j += blockDim.x) cached[j] = order_key(scores[j]);
    __syncthreads();
  }
  auto key_at = [&](int j) { return use_cache ? cached[j] : order_key(scores[j]); };

  uint32_t prefix = 0, mask = 0;
  int remaining = p.heavy_token_num;
  constexpr int kShift[3] = {21, 10, 0};
  constexpr int kBits[3] = {11, 11, 10};
#pragma unroll
  for (int pass = 0; pass < 3; ++pass) {
    const int bins = 1 << kBits[pass];
    for (int i = threadIdx.x; i < bins; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    for (int j = threadIdx.x; j < len; j += blockDim.x) {
      const uint32_t key = key_at(j);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> kShift[pass]) & (bins - 1)], 1);
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      // Lane l sums bins [bins - (l + 1) w, bins - l w) (w = bins / 32), the top bins first.
      const int lane = threadIdx.x, width = bins / 32;
      const int hi = bins - lane * width;
      int sum = 0;
      for (int i = hi - 1; i >= hi - width; --i) sum += hist[i];
      int inclusive = sum;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int n = __shfl_up_sync(0xffffffffu, inclusive, o);
        if (lane >= o) inclusive += n;
      }
      const int before = inclusive - sum;
      const bool here = before < remaining && inclusive >= remaining;
      if (here) {
        int above = before, bin = hi - 1;
        for (; bin > hi - width; --bin) {
          if (above + hist[bin] >= remaining) break;
          above += hist[bin];
        }
        found_prefix = prefix | (static_cast<uint32_t>(bin) << kShift[pass]);
        found_remaining = remaining - above;
      }
    }
    __syncthreads();
    prefix = found_prefix;
    remaining = found_remaining;
    mask |= static_cast<uint32_t>(bins - 1) << kShift[pass];
    __syncthreads();
  }

  // Every key above the threshold key, and the first `remaining` keys equal to it, in index order.
  // Warp w owns keys [w * seg, (w + 1) * seg): it counts its keys above and equal (ballots, no
  // block barrier), the counts are scanned once, then each warp writes at its offset.
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  constexpr int kTopKWarps = kTopKThreads / 32;
  const int seg = ((len + kTopKWarps - 1) / kTopKWarps + 31) / 32 * 32;
  const int lo = warp * seg, hi = min(len, lo + seg);
  const unsigned below_lane = (1u << lane) - 1u;
  int above_count = 0, equal_count = 0;
  for (int base = lo; base < hi; base += 32) {
    const int j = base + lane;
    const uint32_t key = j < hi ? key_at(j) : 0u;
    above_count += __popc(__ballot_sync(0xffffffffu, j < hi && key > prefix));
    equal_count += __popc(__ballot_sync(0xffffffffu, j < hi && key == prefix));
  }
  if (lane == 0) {
    warp_counts[warp] = above_count;
    warp_equal[warp] = equal_count;
  }
  __syncthreads();
  if (warp == 0) {
    // Exclusive scans over the warps: equal keys before each warp, then keys written before it.
    const int eq = warp_equal[lane];
    int eq_incl = eq;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int n = __shfl_up_sync(0xffffffffu, eq_incl, o);
      if (lane >= o) eq_incl += n;
    }
    const int eq_before = eq_incl - eq;
    const int taken = warp_counts[lane] + min(eq, max(0, remaining - eq_before));
    int taken_incl = taken;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int n = __shfl_up_sync(0xffffffffu, taken_incl, o);
      if (lane >= o) taken_incl += n;
    }
    warp_equal[lane] = eq_before;
    warp_counts[lane] = taken_incl - taken;
  }
  __syncthreads();
  int32_t* out = p.selected + static_cast<int64_t>(row) * p.heavy_token_num;
  int written = warp_counts[warp], equal_seen = warp_equal[warp];
  for (int base = lo; base < hi; base += 32) {
    const int j = base + lane;
    const uint32_t key = j < hi ? key_at(j) : 0u;
    const bool above = j < hi && key > prefix;
    const unsigned equal_mask = __ballot_sync(0xffffffffu, j < hi && key == prefix);
    const bool equal = (equal_mask >> lane) & 1u;
    const bool take = above || (equal && equal_seen + __popc(equal_mask & below_lane) < remaining);
    const unsigned take_mask = __ballot_sync(0xffffffffu, take);
    if (take) out[written + __popc(take_mask & below_lane)] = j;
    written += __popc(take_mask);
    equal_seen += __popc(equal_mask);
  }
}

// Each warp walks keys of the split, all G query heads of the KV head at once; the block's warps
// then merge, and the split's (output, max, sum) go to p.partial.
template <typename T, int kElems, int kGroup>
__global__ void __launch_bounds__(kWarps * 32) sparse_attention_kernel(SparseDecode p) {
  const int row = blockIdx.x, split = blockIdx.y;
  const int b = row / p.kv_heads, h = row % p.kv_heads;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int G = p.q_heads / p.kv_heads;
  const int len = p.kv_lens[b];
  const bool sparse = row_is_sparse(len, p);
  const int count = sparse ? p.heavy_token_num : len;
  const int per = (count + p.splits - 1) / p.splits;
  const int start = split * per, end = min(count, start + per);
  const int D = kElems * 32;

  float q[kGroup][kElems];
  const T* qp = static_cast<const T*>(p.q) + (static_cast<int64_t>(b) * p.q_heads + h * G) * D;
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
#pragma unroll
    for (int e = 0; e < kElems; ++e) q[g][e] = g < G ? to_float(qp[g * D + lane * kElems + e]) * p.scale : 0.0f;
  }
  float m[kGroup], l[kGroup], acc[kGroup][kElems];
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int e = 0; e < kElems; ++e) acc[g][e] = 0.0f;
  }
  const int32_t* chosen = p.selected + static_cast<int64_t>(row) * p.heavy_token_num;
  const T* kc = static_cast<const T*>(p.k_cache);
  const T* vc = static_cast<const T*>(p.v_cache);
  // kUnroll consecutive keys per warp step, their rows loaded before any is used, so several
  // dependent index -> page -> row loads are in flight at once.
  constexpr int kUnroll = kElems <= 4 ? 4 : 2;
  for (int i0 = start + warp * kUnroll; i0 < end; i0 += kWarps * kUnroll) {
    float kf[kUnroll][kElems], vf[kUnroll][kElems];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = i0 + u;
      if (i >= end) break;
      const int j = sparse ? chosen[i] : i;
      const int64_t base = (static_cast<int64_t>(slot_of(p, b, j)) * p.kv_heads + h) * D + lane * kElems;
#pragma unroll
      for (int e = 0; e < kElems; ++e) {
        kf[u][e] = to_float(kc[base + e]);
        vf[u][e] = to_float(vc[base + e]);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (i0 + u >= end) break;
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        if (g >= G) break;
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < kElems; ++e) dot += q[g][e] * kf[u][e];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        if (p.logit_cap > 0.0f) dot = p.logit_cap * tanhf(dot / p.logit_cap);
        const float m_new = fmaxf(m[g], dot);
        const float corr = expf(m[g] - m_new);
        const float w = expf(dot - m_new);
        l[g] = l[g] * corr + w;
#pragma unroll
        for (int e = 0; e < kElems; ++e) acc[g][e] = acc[g][e] * corr + w * vf[u][e];
        m[g] = m_new;
      }
    }
  }

  // Merge the warps: warp w's (m, l) and accumulators through shared memory.
  __shared__ float sm_ml[kWarps][kGroup][2];
  __shared__ float sm_acc[kWarps][kGroup][kElems * 32];
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    if (lane == 0) {
      sm_ml[warp][g][0] = m[g];
      sm_ml[warp][g][1] = l[g];
    }
#pragma unroll
    for (int e = 0; e < kElems; ++e) sm_acc[warp][g][lane * kElems + e] = acc[g][e];
  }
  __syncthreads();
  float* part = p.partial + (static_cast<int64_t>(row) * p.splits + split) * G * (D + 2);
  for (int g = 0; g < G; ++g) {
    float top = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) top = fmaxf(top, sm_ml[w][g][0]);
    float sum = 0.0f;
    float scale_w[kWarps];
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      scale_w[w] = top == -INFINITY ? 0.0f : expf(sm_ml[w][g][0] - top);
      sum += sm_ml[w][g][1] * scale_w[w];
    }
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
      float o = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) o += sm_acc[w][g][d] * scale_w[w];
      part[g * (D + 2) + d] = o;
    }
    if (threadIdx.x == 0) {
      part[g * (D + 2) + D] = top;
      part[g * (D + 2) + D + 1] = sum;
    }
  }
}

// out[b, hq] from the splits of its row (and the head's sink in the denominator); lse.
template <typename T>
__global__ void merge_kernel(SparseDecode p) {
  const int b = blockIdx.x / p.q_heads, hq = blockIdx.x % p.q_heads;
  const int G = p.q_heads / p.kv_heads, D = p.head_dim;
  const int row = b * p.kv_heads + hq / G, g = hq % G;
  const float* part = p.partial + static_cast<int64_t>(row) * p.splits * G * (D + 2) + g * (D + 2);
  const int64_t stride = static_cast<int64_t>(G) * (D + 2);
  float top = p.sinks != nullptr ? p.sinks[hq] : -INFINITY;
  for (int s = 0; s < p.splits; ++s) top = fmaxf(top, part[s * stride + D]);
  float sum = p.sinks != nullptr ? expf(p.sinks[hq] - top) : 0.0f;
  for (int s = 0; s < p.splits; ++s) {
    const float ms = part[s * stride + D];
    if (ms != -INFINITY) sum += part[s * stride + D + 1] * expf(ms - top);
  }
  T* out = static_cast<T*>(p.out) + (static_cast<int64_t>(b) * p.q_heads + hq) * D;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float o = 0.0f;
    for (int s = 0; s < p.splits; ++s) {
      const float ms = part[s * stride + D];
      if (ms != -INFINITY) o += part[s * stride + d] * expf(ms - top);
    }
    out[d] = from_float<T>(o / sum);
  }
  if (p.lse != nullptr && threadIdx.x == 0) p.lse[static_cast<int64_t>(b) * p.q_heads + hq] = top + logf(sum);
}

template <typename T, int kElems>
void launch_attention(const SparseDecode& p, int group, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>(p.batch * p.kv_heads), static_cast<unsigned>(p.splits));
  const dim3 block(kWarps * 32);
  if (group <= 1) sparse_attention_kernel<T, kElems, 1><<<grid, block, 0, s>>>(p);
  else if (group <= 2) sparse_attention_kernel<T, kElems, 2><<<grid, block, 0, s>>>(p);
  else if (group <= 4) sparse_attention_kernel<T, kElems, 4><<<grid, block, 0, s>>>(p);
  else sparse_attention_kernel<T, kElems, 8><<<grid, block, 0, s>>>(p);
}

template <typename T>
void run(const SparseDecode& p, cudaStream_t s) {
  const int rows = p.batch * p.kv_heads;
  const int score_blocks = std::clamp((p.max_kv_len + 255) / 256, 1, 1024);
  label_scores_kernel<T><<<dim3(static_cast<unsigned>(score_blocks), static_cast<unsigned>(rows)), 256, 0, s>>>(p);
  CUDA_CHECK(cudaGetLastError());
  const int cache_keys = p.max_kv_len <= kCachedKeys ? p.max_kv_len : 0;
  const size_t smem = static_cast<size_t>(cache_keys) * sizeof(uint32_t);
  raise_dynamic_smem(top_k_kernel, kCachedKeys * sizeof(uint32_t));
  top_k_kernel<<<static_cast<unsigned>(rows), kTopKThreads, smem, s>>>(p, cache_keys);
  CUDA_CHECK(cudaGetLastError());
  const int group = p.q_heads / p.kv_heads;
  switch (p.head_dim) {
    case 64: launch_attention<T, 2>(p, group, s); break;
    case 96: launch_attention<T, 3>(p, group, s); break;
    case 128: launch_attention<T, 4>(p, group, s); break;
    default: launch_attention<T, 8>(p, group, s); break;
  }
  CUDA_CHECK(cudaGetLastError());
  merge_kernel<T><<<static_cast<unsigned>(p.batch * p.q_heads), 128, 0, s>>>(p);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

const char* sparse_decode_problem(int q_heads, int kv_heads, int head_dim, int channels_per_head) {
  if (head_dim != 64 && head_dim != 96 && head_dim != 128 && head_dim != 256) {
    return "head_dim must be 64, 96, 128 or 256";
  }
  if (kv_heads < 1 || q_heads % kv_heads != 0 || q_heads / kv_heads > kMaxGroup) {
    return "at most 8 query heads per KV head are supported";
  }
  if (channels_per_head > kMaxChannels) return "at most 128 label channels per head are supported";
  return "";
}

SparseDecodeWorkspace sparse_decode_workspace(int batch, int q_heads, int kv_heads, int head_dim, int max_kv_len,
                                              int heavy_token_num, int sparse_decode_threshold, int num_sms) {
  SparseDecodeWorkspace w;
  const int64_t rows = static_cast<int64_t>(batch) * kv_heads;
  // The most keys one row attends to: heavy_token_num when sparse, its whole length when shorter
  // than the threshold.
  const int longest = std::max(std::min(heavy_token_num, max_kv_len), std::min(max_kv_len, sparse_decode_threshold - 1));
  const int64_t want = (2 * static_cast<int64_t>(num_sms) + rows - 1) / rows;
  w.splits = static_cast<int>(std::clamp<int64_t>(std::min<int64_t>(want, (longest + 63) / 64), 1, 64));
  w.scores = rows * max_kv_len;
  w.selected = rows * heavy_token_num;
  w.partial = rows * w.splits * (q_heads / kv_heads) * (head_dim + 2);
  return w;
}

void write_labels(const LabelWrite& p, void* stream) {
  const int64_t total = p.n * p.kv_heads * p.channels_per_head;
  const auto blocks = static_cast<unsigned>((total + 255) / 256);
  // The kernel moves 16-bit values: bf16 and f16 alike.
  write_labels_kernel<__nv_bfloat16><<<blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(p);
  CUDA_CHECK(cudaGetLastError());
}

void sparse_decode(const SparseDecode& p, void* stream) {
  if (p.f16) run<__half>(p, static_cast<cudaStream_t>(stream));
  else run<__nv_bfloat16>(p, static_cast<cudaStream_t>(stream));
}

}  // namespace specula::ds_cuda
