// Tree attention: softmax(scale * q.k) of one query row over its sequence's paged prefix plus
// the row's own list of KV slots.
//
// The kernel follows the decode kernel's layout: a block serves one (row, kv head) with up to
// GMAX q heads of the group; "subgroups" of LPK = head_dim / 8 lanes own one key at a time, each
// lane holding 8 consecutive elements of the key's row (16-byte bf16 loads, a subgroup reads
// whole contiguous rows), kUnroll keys deep to keep loads in flight. Each subgroup runs its own
// online softmax; subgroups merge within the warp by shuffles, warps through shared memory,
// always in the same order. Rows are independent: rows of one sequence each read the shared
// prefix (through L2). An fp8 (e4m3) cache is read 8 bytes per lane per row and widened exactly
// to f32; its K scale is folded into the query's multiplier and its V scale into the output's.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "specula/attention/cuda/kernels/tree_attention.h"
#include "specula/core/cuda_check.h"
#include "specula/core/cuda_pdl.cuh"

namespace specula::cuda_kernels {

namespace {

constexpr float kNegInf = -__builtin_huge_valf();
constexpr float kLog2e = 1.4426950408889634f;

constexpr int kEpl = 8;  // bf16 elements per lane per row: one 16-byte load

__device__ __forceinline__ void unpack_bf16x8(const uint4& raw, float (&dst)[kEpl]) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    dst[2 * i] = __uint_as_float(words[i] << 16);
    dst[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}

// Eight e4m3 values (one 8-byte load) to f32; every e4m3 value is exact in f16 and in f32.
__device__ __forceinline__ void unpack_fp8x8(const uint2& raw, float (&dst)[kEpl]) {
  const uint32_t words[2] = {raw.x, raw.y};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const auto pair = static_cast<__nv_fp8x2_storage_t>((words[i / 2] >> (16 * (i % 2))) & 0xffffu);
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
    dst[2 * i] = f.x;
    dst[2 * i + 1] = f.y;
  }
}

// A row's 8 elements of one lane as raw bits: 16 bytes of bf16 or 8 bytes of e4m3.
template <bool FP8>
struct KvRaw;
template <>
struct KvRaw<false> {
  using Bits = uint4;
  using Elem = __nv_bfloat16;
  static __device__ __forceinline__ Bits zero() { return make_uint4(0, 0, 0, 0); }
  static __device__ __forceinline__ void unpack(const Bits& raw, float (&dst)[kEpl]) { unpack_bf16x8(raw, dst); }
};
template <>
struct KvRaw<true> {
  using Bits = uint2;
  using Elem = uint8_t;
  static __device__ __forceinline__ Bits zero() { return make_uint2(0, 0); }
  static __device__ __forceinline__ void unpack(const Bits& raw, float (&dst)[kEpl]) { unpack_fp8x8(raw, dst); }
};

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

template <int HEAD_DIM, int GMAX, bool FP8>
__global__ void __launch_bounds__(AttnConfig<HEAD_DIM>::kThreads) tree_attention_kernel(const TreeAttentionParams p) {
  pdl_wait();
  pdl_trigger();
  using Cfg = AttnConfig<HEAD_DIM>;
  using Raw = KvRaw<FP8>;
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
  const int seq = r / p.rows_per_seq;
  const int prefix_len = p.prefix_lens[seq];
  const int branch_len = p.branch_lens != nullptr ? p.branch_lens[r] : p.branch_len;
  const int total = prefix_len + branch_len;

  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int subgroup = warp * (32 / LPK) + lane / LPK;
  const int d0 = (lane % LPK) * kEpl;

  // q with scale and log2(e) folded in, so scores are in log2 units for exp2f.
  const __nv_bfloat16* q = static_cast<const __nv_bfloat16*>(p.q);
  const float q_mul = p.scale * kLog2e * (FP8 ? p.k_descale : 1.0f);
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

  const int32_t* pages = p.prefix_pages + static_cast<int64_t>(seq) * p.page_stride;
  const int32_t* branch = p.branch_slots + static_cast<int64_t>(r) * p.branch_stride;
  const auto* k_cache = static_cast<const typename Raw::Elem*>(p.k_cache);
  const auto* v_cache = static_cast<const typename Raw::Elem*>(p.v_cache);
  // The trip count is uniform across the block (one row per block): the shuffles below need every lane.
  for (int base = 0; base < total; base += kSubgroups * kUnroll) {
    typename Raw::Bits k_raw[kUnroll], v_raw[kUnroll];
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
      using Bits = typename Raw::Bits;
      k_raw[u] = valid[u] ? __ldg(reinterpret_cast<const Bits*>(k_cache + offset)) : Raw::zero();
      v_raw[u] = valid[u] ? __ldg(reinterpret_cast<const Bits*>(v_cache + offset)) : Raw::zero();
    }
    float s[kUnroll][GMAX];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float kf[kEpl];
      Raw::unpack(k_raw[u], kf);
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
        Raw::unpack(v_raw[u], vf);
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
    const float inv = sum_l > 0.0f ? (FP8 ? p.v_descale : 1.0f) / sum_l : 0.0f;
    uint4 packed;
    packed.x = pack_bf16x2(acc[0] * inv, acc[1] * inv);
    packed.y = pack_bf16x2(acc[2] * inv, acc[3] * inv);
    packed.z = pack_bf16x2(acc[4] * inv, acc[5] * inv);
    packed.w = pack_bf16x2(acc[6] * inv, acc[7] * inv);
    *reinterpret_cast<uint4*>(out + (static_cast<int64_t>(r) * p.num_q_heads + head0 + h) * HEAD_DIM + c0) = packed;
    if (p.lse != nullptr && c0 == 0) {
      // m is in log2 units: ln sum exp(s) = ln 2 * (m + log2 l).
      p.lse[static_cast<int64_t>(r) * p.lse_stride_token + head0 + h] =
          sum_l > 0.0f ? (mx + log2f(sum_l)) * 0.6931471805599453f : kNegInf;
    }
  }
}

template <int HEAD_DIM, bool FP8>
void launch(const TreeAttentionParams& p, cudaStream_t s) {
  const int group = p.num_q_heads / p.num_kv_heads;
  auto run = [&](auto gmax_tag) {
    constexpr int GMAX = decltype(gmax_tag)::value;
    const int head_blocks = (group + GMAX - 1) / GMAX;
    const dim3 grid(static_cast<unsigned>(p.rows), static_cast<unsigned>(p.num_kv_heads * head_blocks));
    launch_pdl(tree_attention_kernel<HEAD_DIM, GMAX, FP8>, grid, AttnConfig<HEAD_DIM>::kThreads, 0, s, p);
  };
  if (group <= 1) run(std::integral_constant<int, 1>{});
  else if (group <= 2) run(std::integral_constant<int, 2>{});
  else if (group <= 4) run(std::integral_constant<int, 4>{});
  else run(std::integral_constant<int, 8>{});  // larger groups take several blocks per kv head
  CUDA_CHECK(cudaGetLastError());
}

bool aligned(const void* ptr, uintptr_t bytes) { return (reinterpret_cast<uintptr_t>(ptr) & (bytes - 1)) == 0; }

template <bool FP8>
void launch_dim(const TreeAttentionParams& p, cudaStream_t s) {
  if (p.head_dim == 64) launch<64, FP8>(p, s);
  else if (p.head_dim == 128) launch<128, FP8>(p, s);
  else launch<256, FP8>(p, s);
}

}  // namespace

// Preconditions, asserted: the attention backend's selection (select_cuda_draft_tree) decides
// which layers come here; these checks catch a caller that bypasses it.
void tree_attention(const TreeAttentionParams& p, cudaStream_t s) {
  SPECULA_REQUIRE(p.head_dim == 64 || p.head_dim == 128 || p.head_dim == 256,
                  "tree_attention: head_dim " + std::to_string(p.head_dim) +
                      " is not supported; supported: 64, 128, 256");
  SPECULA_REQUIRE(p.num_kv_heads >= 1 && p.num_q_heads >= p.num_kv_heads && p.num_q_heads % p.num_kv_heads == 0,
                  "tree_attention: num_q_heads " + std::to_string(p.num_q_heads) +
                      " must be a positive multiple of num_kv_heads " + std::to_string(p.num_kv_heads));
  SPECULA_REQUIRE(p.rows_per_seq >= 1 && p.rows >= 0 && p.page_size >= 1 && p.branch_stride >= 0,
                  "tree_attention: rows " + std::to_string(p.rows) + ", rows_per_seq " +
                      std::to_string(p.rows_per_seq) + ", page_size " + std::to_string(p.page_size) +
                      ", branch_stride " + std::to_string(p.branch_stride) + " are not valid");
  // Per-row lengths live on the device; only the uniform one can be checked here.
  SPECULA_REQUIRE(p.branch_lens != nullptr || (p.branch_len >= 0 && p.branch_len <= p.branch_stride),
                  "tree_attention: branch_len " + std::to_string(p.branch_len) + " must be in [0, branch_stride = " +
                      std::to_string(p.branch_stride) + "]");
  // 16-byte row loads and stores (8-byte loads of an fp8 cache).
  const uintptr_t kv_align = p.kv_fp8 ? 8 : 16;
  SPECULA_REQUIRE(aligned(p.q, 16) && aligned(p.k_cache, kv_align) && aligned(p.v_cache, kv_align) && aligned(p.out, 16),
                  "tree_attention: q and out must be 16-byte aligned, k_cache and v_cache " + std::to_string(kv_align) +
                      "-byte aligned");
  if (p.rows == 0) return;
  if (p.kv_fp8) {
    launch_dim<true>(p, s);
  } else {
    launch_dim<false>(p, s);
  }
}

}  // namespace specula::cuda_kernels
