// Double sparsity's kernels (ds_kernels.h): label writes, attention over the chosen keys in splits,
// and the split merge; the choice itself (label scores and top-k) is ds_select.cu's.
#include "specula/attention/double_sparsity/ds_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "specula/attention/cuda/kernels/mma.cuh"
#include "specula/attention/double_sparsity/ds_device.cuh"
#include "specula/core/cuda_check.h"
#include "specula/core/cuda_smem.h"

namespace specula::ds_cuda {
namespace {

constexpr int kWarps = 8;  // attention block
constexpr int kMaxGroup = 8;
constexpr int kMaxSplits = 64;

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }

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
  static_cast<T*>(p.labels)[(h * p.label_slots + slot) * p.channels_per_head + hc % p.channels_per_head] =
      k[p.channels[hc]];
}

// One lane's kElems values of a V row, in one load where their width allows.
template <typename T, int kElems>
__device__ __forceinline__ void load_row(const T* src, float* out) {
  if constexpr (kElems == 2 || kElems == 4 || kElems == 8) {
    using Raw = std::conditional_t<kElems == 2, uint32_t, std::conditional_t<kElems == 4, uint2, uint4>>;
    const Raw raw = *reinterpret_cast<const Raw*>(src);
    const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int e = 0; e < kElems; ++e) out[e] = to_float(v[e]);
  } else {
#pragma unroll
    for (int e = 0; e < kElems; ++e) out[e] = to_float(src[e]);
  }
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// Lanes per key of the attention kernel: 4 while the rows are fewer than the multiprocessors.
int lanes_per_key(int64_t rows, int num_sms) { return rows < num_sms ? 4 : 1; }

// The attention kernel's blocks per multiprocessor to compile for (0: no bound). One lane per key
// with small accumulators and head_dim <= 128: two (128 registers a thread). Left to itself the
// compiler holds a whole step's K pieces and V copies' addresses at once (170 registers, one
// block a multiprocessor: batch 32 then ran in four waves instead of two). At head_dim 256 the V
// stage (128 KiB) admits one block anyway, so a bound would only spill. Four lanes per key take
// 80 registers unbounded, while a bound of two blocks let them take 128, three blocks no longer
// fit, and batch 8 ran a second wave.
template <int kElems, int kGroup, int kLanesPerKey>
constexpr int attention_min_blocks() {
  return kLanesPerKey == 1 && kElems <= 4 && kElems * kGroup <= 16 ? 2 : 0;
}

// Attention over one split of a row's chosen keys (every key of a dense row) for the G query heads
// of its KV head. A warp takes 32 / kLanesPerKey keys a step, kLanesPerKey lanes per key: each
// lane scores its share of its key's K row against the G queries (in shared memory) and shuffles
// finish the dot products, so a step needs one warp-wide max and one exp per key and head; the
// lanes then own head_dim / 32 output columns each and add the step's V rows. Small batches take
// 4 lanes per key: short steps keep each warp's chain of dependent instructions short, so that a
// batch of one request still has several warps per scheduler to hide latency with; large batches,
// with warps to spare, take 1 lane per key (fewer shuffles per key). The block's warps merge in shared memory and
// write the split's (output, max, sum). The row's last split to finish merges all of them into the
// output and LSE (an arrival counter per row, which it resets for the next call), so a decode is
// two launches.
template <typename T, int kElems, int kGroup, int kLanesPerKey>
__global__ void __launch_bounds__(kWarps * 32, (attention_min_blocks<kElems, kGroup, kLanesPerKey>()))
    sparse_attention_kernel(SparseDecode p) {
  constexpr int D = kElems * 32;
  constexpr int kKeysPerStep = 32 / kLanesPerKey;
  constexpr int kChunks = D / kLanesPerKey / 8;  // 16-byte pieces of K per lane
  constexpr int kRowPieces = D / 8;              // 16-byte pieces of a V row
  static_assert(kKeysPerStep * kRowPieces % 32 == 0, "a step's V pieces are whole rounds of the warp");
  // The loop stages each warp's step of V rows here; the warps' partials reuse it after the loop.
  extern __shared__ __align__(16) float sm_acc[];  // [kWarps][kKeysPerStep][D] of T, then [kWarps][kGroup][D]
  const int row = blockIdx.x, split = blockIdx.y;
  const int b = row / p.kv_heads, h = row % p.kv_heads;
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int key_lane = lane / kLanesPerKey, part = lane % kLanesPerKey;
  const int G = p.q_heads / p.kv_heads;
  const int len = p.kv_lens[b];
  const bool sparse = row_is_sparse(len, p);
  const int count = sparse ? p.heavy_token_num : len;
  const int per = (count + p.splits - 1) / p.splits;
  const int start = min(count, split * per), end = min(count, start + per);

  __shared__ __align__(16) float q_s[kGroup][D];
  const T* qp = static_cast<const T*>(p.q) + (static_cast<int64_t>(b) * p.q_heads + h * G) * D;
  for (int i = tid; i < kGroup * D; i += kWarps * 32) {
    const int g = i / D;
    q_s[g][i % D] = g < G ? to_float(qp[i]) * p.scale : 0.0f;
  }
  __syncthreads();

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
  T* v_stage = reinterpret_cast<T*>(sm_acc) + warp * kKeysPerStep * D;
  // Keys past the end repeat the last one (their scores are then masked), so that every load is
  // unconditional and a lane's piece of K is requested before any of it is used.
  const auto slot_at = [&](int base) {
    const int i = min(base + key_lane, end - 1);
    return sparse ? chosen[i] : slot_of(p, b, i);
  };
  constexpr int kStride = kWarps * kKeysPerStep;
  int base = start + warp * kKeysPerStep;
  int slot = base < end ? slot_at(base) : 0;
  for (; base < end; base += kStride) {
    const bool valid = base + key_lane < end;
    // The step's V rows go to the warp's stage (cp.async) together with K's loads, and the next
    // step's cache rows are requested before this step's scores: a step waits on one memory round
    // trip, not on one per 8 V rows and one more for its rows' indices.
#pragma unroll
    for (int x = lane; x < kKeysPerStep * kRowPieces; x += 32) {
      const int k = x / kRowPieces, piece = x % kRowPieces;
      const int slot_k = __shfl_sync(0xffffffffu, slot, k * kLanesPerKey);
      cuda_kernels::cp_async_16(v_stage + k * D + piece * 8,
                                vc + (static_cast<int64_t>(slot_k) * p.kv_heads + h) * D + piece * 8, true);
    }
    cuda_kernels::cp_async_commit();
    // Piece c of a lane is the key's 16 bytes at (c * kLanesPerKey + part) * 16, so that a key's
    // lanes read whole sectors together.
    const T* krow = kc + (static_cast<int64_t>(slot) * p.kv_heads + h) * D;
    uint4 raw[kChunks];
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      raw[c] = *reinterpret_cast<const uint4*>(krow + (c * kLanesPerKey + part) * 8);
    }
    const int next_slot = base + kStride < end ? slot_at(base + kStride) : 0;
    float s[kGroup];
#pragma unroll
    for (int g = 0; g < kGroup; ++g) s[g] = 0.0f;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const T* kv = reinterpret_cast<const T*>(&raw[c]);
      float kf[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) kf[e] = to_float(kv[e]);
      const int d0 = (c * kLanesPerKey + part) * 8;
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        const float4 q0 = *reinterpret_cast<const float4*>(&q_s[g][d0]);
        const float4 q1 = *reinterpret_cast<const float4*>(&q_s[g][d0 + 4]);
        s[g] += q0.x * kf[0] + q0.y * kf[1] + q0.z * kf[2] + q0.w * kf[3] + q1.x * kf[4] + q1.y * kf[5] +
                q1.z * kf[6] + q1.w * kf[7];
      }
    }
    // The step's first key is always valid, so each head's step maximum is finite.
    float w[kGroup];
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      float x = s[g];
#pragma unroll
      for (int o = 1; o < kLanesPerKey; o <<= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
      if (p.logit_cap > 0.0f) x = p.logit_cap * tanhf(x / p.logit_cap);
      x = valid ? x : -INFINITY;
      float step_max = x;
#pragma unroll
      for (int o = kLanesPerKey; o < 32; o <<= 1) step_max = fmaxf(step_max, __shfl_xor_sync(0xffffffffu, step_max, o));
      const float m_new = fmaxf(m[g], step_max);
      const float corr = expf(m[g] - m_new);
      w[g] = expf(x - m_new);
      // A key's weight is on each of its lanes; its first lane counts it.
      l[g] = l[g] * corr + (part == 0 ? w[g] : 0.0f);
      m[g] = m_new;
#pragma unroll
      for (int e = 0; e < kElems; ++e) acc[g][e] *= corr;
    }
    // The step's V rows from the stage. A repeated key past the end has weight 0 and a finite row
    // (a real key's), so it adds nothing.
    cuda_kernels::cp_async_wait<0>();
    __syncwarp();
#pragma unroll
    for (int k = 0; k < kKeysPerStep; ++k) {
      float vf[kElems];
      load_row<T, kElems>(v_stage + k * D + lane * kElems, vf);
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        const float wk = __shfl_sync(0xffffffffu, w[g], k * kLanesPerKey);
#pragma unroll
        for (int e = 0; e < kElems; ++e) acc[g][e] += wk * vf[e];
      }
    }
    // Every lane has read the stage before the next step's copies overwrite it.
    __syncwarp();
    slot = next_slot;
  }
#pragma unroll
  for (int g = 0; g < kGroup; ++g) l[g] = warp_sum(l[g]);

  // The block's warps merge through shared memory, into this split's partial; the stages are done
  // with once every warp has left the loop.
  __shared__ float sm_ml[kWarps][kGroup][2];
  __syncthreads();
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    if (lane == 0) {
      sm_ml[warp][g][0] = m[g];
      sm_ml[warp][g][1] = l[g];
    }
#pragma unroll
    for (int e = 0; e < kElems; ++e) sm_acc[(warp * kGroup + g) * D + lane * kElems + e] = acc[g][e];
  }
  __syncthreads();
  const int64_t stride = static_cast<int64_t>(G) * (D + 2);
  float* row_part = p.partial + static_cast<int64_t>(row) * p.splits * stride;
  float* part_out = row_part + split * stride;
  for (int x = tid; x < G * D; x += kWarps * 32) {
    const int g = x / D, d = x % D;
    float top = -INFINITY;
#pragma unroll
    for (int v = 0; v < kWarps; ++v) top = fmaxf(top, sm_ml[v][g][0]);
    float o = 0.0f, sum = 0.0f;
#pragma unroll
    for (int v = 0; v < kWarps; ++v) {
      const float wv = top == -INFINITY ? 0.0f : expf(sm_ml[v][g][0] - top);
      o += sm_acc[(v * kGroup + g) * D + d] * wv;
      sum += sm_ml[v][g][1] * wv;
    }
    part_out[g * (D + 2) + d] = o;
    if (d == 0) {
      part_out[g * (D + 2) + D] = top;
      part_out[g * (D + 2) + D + 1] = sum;
    }
  }

  // The last split of the row to arrive merges the row's splits.
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (tid == 0) last = atomicAdd(p.counters + row, 1) == p.splits - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  __shared__ float split_w[kMaxGroup][kMaxSplits];
  __shared__ float row_sum[kMaxGroup];
  if (warp < G) {
    // Warp g weighs head g's splits; lane t holds splits t and t + 32.
    const int g = warp, hq = h * G + g;
    float ms[2], ls[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int sp = lane + 32 * k;
      ms[k] = sp < p.splits ? __ldcg(row_part + sp * stride + g * (D + 2) + D) : -INFINITY;
      ls[k] = sp < p.splits ? __ldcg(row_part + sp * stride + g * (D + 2) + D + 1) : 0.0f;
    }
    const float sink = p.sinks != nullptr ? p.sinks[hq] : -INFINITY;
    const float top = fmaxf(sink, warp_max(fmaxf(ms[0], ms[1])));
    float part_sum = 0.0f;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const float wk = ms[k] == -INFINITY ? 0.0f : expf(ms[k] - top);
      part_sum += ls[k] * wk;
      if (lane + 32 * k < p.splits) split_w[g][lane + 32 * k] = wk;
    }
    const float sum = warp_sum(part_sum) + (p.sinks != nullptr ? expf(sink - top) : 0.0f);
    if (lane == 0) {
      row_sum[g] = sum;
      if (p.lse != nullptr) p.lse[static_cast<int64_t>(b) * p.q_heads + hq] = top + logf(sum);
    }
  }
  __syncthreads();
  T* out = static_cast<T*>(p.out) + (static_cast<int64_t>(b) * p.q_heads + h * G) * D;
  for (int x = tid; x < G * D; x += kWarps * 32) {
    const int g = x / D, d = x % D;
    const float* col = row_part + g * (D + 2) + d;
    float o = 0.0f;
#pragma unroll 8
    for (int sp = 0; sp < p.splits; ++sp) o += __ldcg(col + sp * stride) * split_w[g][sp];
    out[x] = from_float<T>(o / row_sum[g]);
  }
  if (tid == 0) p.counters[row] = 0;
}

template <typename T, int kElems, int kGroup>
void launch_group(const SparseDecode& p, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>(p.batch * p.kv_heads), static_cast<unsigned>(p.splits));
  const int lanes = lanes_per_key(p.batch * p.kv_heads, p.num_sms);
  const size_t partials = static_cast<size_t>(kWarps) * kGroup * kElems * 32 * sizeof(float);
  const size_t stages = static_cast<size_t>(kWarps) * (32 / lanes) * kElems * 32 * sizeof(T);
  const size_t smem = std::max(partials, stages);
  const auto kernel =
      lanes == 1 ? sparse_attention_kernel<T, kElems, kGroup, 1> : sparse_attention_kernel<T, kElems, kGroup, 4>;
  raise_dynamic_smem(kernel, smem);
  kernel<<<grid, kWarps * 32, smem, s>>>(p);
}

template <typename T, int kElems>
void launch_attention(const SparseDecode& p, int group, cudaStream_t s) {
  if (group <= 1) launch_group<T, kElems, 1>(p, s);
  else if (group <= 2) launch_group<T, kElems, 2>(p, s);
  else if (group <= 4) launch_group<T, kElems, 4>(p, s);
  else launch_group<T, kElems, 8>(p, s);
}

template <typename T>
void run(const SparseDecode& p, cudaStream_t s) {
  select_heavy_tokens(p, s);
  const int group = p.q_heads / p.kv_heads;
  switch (p.head_dim) {
    case 64: launch_attention<T, 2>(p, group, s); break;
    case 96: launch_attention<T, 3>(p, group, s); break;
    case 128: launch_attention<T, 4>(p, group, s); break;
    default: launch_attention<T, 8>(p, group, s); break;
  }
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
  if (channels_per_head > kMaxLabelChannels) return "at most 128 label channels per head are supported";
  return "";
}

SparseDecodeWorkspace sparse_decode_workspace(int batch, int q_heads, int kv_heads, int head_dim, int max_kv_len,
                                              int heavy_token_num, int sparse_decode_threshold, int num_sms) {
  SparseDecodeWorkspace w;
  const int64_t rows = static_cast<int64_t>(batch) * kv_heads;
  // The most keys one row attends to: heavy_token_num when sparse, its whole length when shorter
  // than the threshold.
  const int longest = std::max(std::min(heavy_token_num, max_kv_len), std::min(max_kv_len, sparse_decode_threshold - 1));
  // About two blocks (16 warps) per multiprocessor, each over a step of each of its warps or more
  // (64 keys at 4 lanes per key, 256 at 1).
  const int64_t want = (2 * static_cast<int64_t>(num_sms) + rows - 1) / rows;
  const int64_t block_keys = static_cast<int64_t>(kWarps) * 32 / lanes_per_key(rows, num_sms);
  w.splits = static_cast<int>(
      std::clamp<int64_t>(std::min<int64_t>(want, (longest + block_keys - 1) / block_keys), 1, kMaxSplits));
  w.scores = select_plan(static_cast<int>(rows), max_kv_len, num_sms).cached_keys > 0 ? 0 : rows * max_kv_len;
  w.selected = rows * heavy_token_num;
  w.partial = rows * w.splits * (q_heads / kv_heads) * (head_dim + 2);
  w.counters = rows;
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
