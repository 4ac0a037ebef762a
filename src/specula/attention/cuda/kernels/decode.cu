// Split-KV decode (flash-decoding) over a paged KV cache, on CUDA cores: the path for fp8 caches
// and for caches whose dtype differs from the query's or whose v_head_dim differs from head_dim;
// everything else goes to the tensor-core kernel (decode_tc.cu).
//
// Grid: (num_kv_heads x head_blocks, num_splits, num_seqs); 128 threads. A block serves up to
// kHeads query heads of one KV head (GQA heads packed: each K/V row is read once for all of
// them) over one key range. Lanes are grouped in "subgroups" of LPK lanes; a subgroup owns one
// key at a time and each lane holds 8 consecutive elements of that key's row (16-byte loads for
// 16-bit caches), so a warp works on 32 / LPK keys at once, kUnroll deep to keep loads in
// flight. Scores use exp2 with log2(e) folded into q. Subgroups are merged through shared
// memory; with several splits the last block to finish merges the splits (decode_block.cuh).
#include <type_traits>

#include "specula/attention/cuda/kernels/attention_params.h"
#include "specula/attention/cuda/kernels/convert.cuh"
#include "specula/attention/cuda/kernels/decode_block.cuh"
#include "specula/attention/cuda/kernels/io.cuh"
#include "specula/core/cuda_check.h"

namespace specula::cuda_kernels {

namespace {

constexpr int kThreads = 128;
constexpr int kEpl = 8;     // elements per lane per row
constexpr int kUnroll = 4;  // keys per subgroup per iteration, loaded before any is used
constexpr float kNegInf = -__builtin_huge_valf();

// 8 consecutive cache elements, kept packed in registers until used (16 bytes for 16-bit
// caches, 8 for fp8), so many keys' loads can be in flight per thread.
template <typename KV>
struct Raw8 {
  using type = uint4;
};
template <>
struct Raw8<__nv_fp8_e4m3> {
  using type = uint2;
};

template <typename KV>
__device__ __forceinline__ typename Raw8<KV>::type load_raw8(const KV* src) {
  return __ldg(reinterpret_cast<const typename Raw8<KV>::type*>(src));
}

template <typename KV>
__device__ __forceinline__ void unpack8(const typename Raw8<KV>::type& raw, float (&dst)[kEpl]);

template <>
__device__ __forceinline__ void unpack8<__nv_bfloat16>(const uint4& raw, float (&dst)[kEpl]) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    dst[2 * i] = __uint_as_float(words[i] << 16);
    dst[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}

template <>
__device__ __forceinline__ void unpack8<__half>(const uint4& raw, float (&dst)[kEpl]) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&words[i]));
    dst[2 * i] = f.x;
    dst[2 * i + 1] = f.y;
  }
}

template <>
__device__ __forceinline__ void unpack8<__nv_fp8_e4m3>(const uint2& raw, float (&dst)[kEpl]) {
  fp8x8_to_float(raw, dst);
}

template <typename KV, int LPK, int kHeads>
__global__ void __launch_bounds__(kThreads) decode_kernel(const AttentionParams p, const DecodeSplit split) {
  constexpr int kSubPerWarp = 32 / LPK;
  constexpr int kSubgroups = (kThreads / 32) * kSubPerWarp;
  constexpr int kRowWidth = LPK * kEpl;
  __shared__ float sm_m[kSubgroups][kHeads];
  __shared__ float sm_l[kSubgroups][kHeads];
  __shared__ float sm_o[kSubgroups][kHeads][kRowWidth];

  const DecodeBlock b = decode_block(p, split, kHeads);
  const int kv_head = b.kv_head;
  const int head0 = b.head0;
  const int num_heads = b.num_heads;
  const int64_t token = b.token;
  const int begin = b.begin;
  const int end = b.end;

  const int lane = threadIdx.x & 31;
  const int subgroup = (threadIdx.x >> 5) * kSubPerWarp + lane / LPK;
  const int d0 = (lane % LPK) * kEpl;
  const bool k_lane = d0 < p.head_dim;
  const bool v_lane = d0 < p.v_head_dim;
  const bool capped = p.logit_cap > 0.0f;

  // q pre-multiplied by the scale, the K descale and (without soft-cap) log2(e).
  float q[kHeads][kEpl];
  const float q_mul = p.scale * p.k_descale * (capped ? 1.0f : kLog2e);
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
#pragma unroll
    for (int e = 0; e < kEpl; ++e) {
      q[h][e] = (h < num_heads && k_lane)
                    ? load_io(p.q, p.io_dtype, token * p.q_stride_token + (head0 + h) * p.q_stride_head + d0 + e) * q_mul
                    : 0.0f;
    }
  }
  float m[kHeads], l[kHeads], o[kHeads][kEpl];
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
    m[h] = kNegInf;
    l[h] = 0.0f;
#pragma unroll
    for (int e = 0; e < kEpl; ++e) o[h][e] = 0.0f;
  }

  const int32_t* pages = p.page_table + static_cast<int64_t>(b.seq) * p.page_table_stride;
  const KV* k_cache = static_cast<const KV*>(p.k_cache);
  const KV* v_cache = static_cast<const KV*>(p.v_cache);
  for (int base = begin; base < end; base += kSubgroups * kUnroll) {
    using Raw = typename Raw8<KV>::type;
    Raw k_raw[kUnroll], v_raw[kUnroll];
    bool valid[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int j = base + u * kSubgroups + subgroup;
      valid[u] = j < end;
      const int64_t slot = valid[u] ? static_cast<int64_t>(pages[j / p.page_size]) * p.page_size + j % p.page_size : 0;
      const int64_t row = slot * p.num_kv_heads + kv_head;
      k_raw[u] = (valid[u] && k_lane) ? load_raw8<KV>(k_cache + row * p.head_dim + d0) : Raw{};
      v_raw[u] = (valid[u] && v_lane) ? load_raw8<KV>(v_cache + row * p.v_head_dim + d0) : Raw{};
    }
    float s[kUnroll][kHeads];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float kf[kEpl];
      unpack8<KV>(k_raw[u], kf);
#pragma unroll
      for (int h = 0; h < kHeads; ++h) {
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < kEpl; ++e) dot = fmaf(q[h][e], kf[e], dot);
#pragma unroll
        for (int off = LPK / 2; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
        if (capped) dot = p.logit_cap * tanhf(dot / p.logit_cap) * kLog2e;
        s[u][h] = valid[u] ? dot : kNegInf;
      }
    }
#pragma unroll
    for (int h = 0; h < kHeads; ++h) {
      float m_new = m[h];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) m_new = fmaxf(m_new, s[u][h]);
      if (m_new == kNegInf) continue;  // nothing visible yet for this subgroup
      const float alpha = exp2f(m[h] - m_new);  // m = -inf gives 0
      l[h] *= alpha;
#pragma unroll
      for (int e = 0; e < kEpl; ++e) o[h][e] *= alpha;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const float pu = exp2f(s[u][h] - m_new);
        l[h] += pu;
        float vf[kEpl];
        unpack8<KV>(v_raw[u], vf);
#pragma unroll
        for (int e = 0; e < kEpl; ++e) o[h][e] = fmaf(pu, vf[e], o[h][e]);
      }
      m[h] = m_new;
    }
  }

#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
    if (lane % LPK == 0) {
      sm_m[subgroup][h] = m[h];
      sm_l[subgroup][h] = l[h];
    }
#pragma unroll
    for (int e = 0; e < kEpl; ++e) sm_o[subgroup][h][d0 + e] = o[h][e];
  }
  __syncthreads();

  finish_decode<kSubgroups>(p, split, b, &sm_m[0][0], &sm_l[0][0], &sm_o[0][0][0], kHeads, kRowWidth);
}

template <typename KV, int LPK>
void launch_heads(const AttentionParams& p, const DecodeSplit& split, cudaStream_t stream) {
  const int group = p.num_q_heads / p.num_kv_heads;
  auto run = [&](auto heads_tag) {
    constexpr int kHeads = decltype(heads_tag)::value;
    const int head_blocks = (group + kHeads - 1) / kHeads;
    const dim3 grid(p.num_kv_heads * head_blocks, split.num_splits, p.num_seqs);
    decode_kernel<KV, LPK, kHeads><<<grid, kThreads, 0, stream>>>(p, split);
  };
  if (group <= 1) run(std::integral_constant<int, 1>{});
  else if (group <= 2) run(std::integral_constant<int, 2>{});
  else if (group <= 4) run(std::integral_constant<int, 4>{});
  else run(std::integral_constant<int, kDecodeHeadsPerBlock>{});
}

template <typename KV>
void launch_for_kv(const AttentionParams& p, const DecodeSplit& split, cudaStream_t stream) {
  const int width = p.head_dim > p.v_head_dim ? p.head_dim : p.v_head_dim;
  if (width <= 64) launch_heads<KV, 8>(p, split, stream);
  else if (width <= 128) launch_heads<KV, 16>(p, split, stream);
  else launch_heads<KV, 32>(p, split, stream);
}

}  // namespace

void launch_decode(const AttentionParams& p, const DecodeSplit& split, cudaStream_t stream) {
  if (p.num_seqs == 0) return;
  SPECULA_REQUIRE(p.head_dim % kEpl == 0 && p.v_head_dim % kEpl == 0 && p.head_dim <= 256 && p.v_head_dim <= 256,
                  "decode: head_dim " + std::to_string(p.head_dim) + " / v_head_dim " + std::to_string(p.v_head_dim) +
                      " must be multiples of 8 up to 256");
  SPECULA_REQUIRE(split.num_splits >= 1 && split.num_splits <= kMaxDecodeSplits,
                  "decode: " + std::to_string(split.num_splits) + " splits; allowed 1 to " +
                      std::to_string(kMaxDecodeSplits));
  if (!launch_decode_tc(p, split, stream)) {
    switch (p.kv_dtype) {
      case kBF16: launch_for_kv<__nv_bfloat16>(p, split, stream); break;
      case kF16: launch_for_kv<__half>(p, split, stream); break;
      case kFp8E4m3: launch_for_kv<__nv_fp8_e4m3>(p, split, stream); break;
      default: SPECULA_REQUIRE(false, "decode: KV dtype code " + std::to_string(p.kv_dtype) + " is not supported");
    }
  }
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace specula::cuda_kernels
