// The kernels of a mixture-of-experts layer on the GPU (CudaMoe runs them in this order):
//   moe_route      each token's experts and weights from the router logits, as moe_route (model/
//                  moe.h) defines them: softmax or sigmoid scores, the correction bias for the
//                  selection only, group-limited top-k, ties to the lower index, renormalisation
//                  and the routed scaling factor;
//   moe_align      the (token, expert) pairs sorted by expert, each expert's run padded to whole
//                  blocks of block_m rows (vLLM's / SGLang's moe_align_block_size), all on the
//                  device so that a decode step can be captured in a CUDA graph;
//   moe_gemm       the grouped GEMM over those blocks: a block of rows belongs to one expert and
//                  reads only that expert's weights; bf16 tensor cores over the hi/lo bf16 split
//                  of the f32 activations, f32 accumulation (the medium tile, and the small one
//                  with fp8 weights, on mma.sync; the large one on warpgroup MMA,
//                  moe_gemm_wgmma, and the small one with bf16 weights too, the weights as the
//                  M side, moe_gemm_decode). The gate|up product ends in the
//                  SiLU gate (act = silu(gate) * up, written as a hi/lo split for the down
//                  product); the down product writes f32 rows;
//   moe_combine    out[t] = sum_j w[t, j] y[pair (t, j)], one pass, no atomics.
// Shared experts run as routed ones that every token picks with weight 1 (moe_route appends them).
// Everything is deterministic: a row's arithmetic does not depend on which rows share its block.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace specula::cuda_kernels {

struct MoeRouteParams {
  const float* logits = nullptr;  // [n, experts] f32
  const float* bias = nullptr;    // [experts] (noaux_tc's e_score_correction_bias) or null
  int64_t n = 0;
  int experts = 0, top_k = 0, groups = 1, top_groups = 1;
  int method = 0;  // MoeConfig::TopK: 0 greedy, 1 group-limited greedy, 2 noaux_tc
  bool sigmoid = false, normalise = false, scale = false;
  double scaling_factor = 1.0;
  // Shared experts folded into the routed ones (SGLang's shared-expert fusion): every token also
  // takes experts `experts` .. `experts + shared - 1` with weight 1, after its top_k picks.
  int shared = 0;
  int32_t* ids = nullptr;   // [n, top_k + shared]
  float* weights = nullptr;  // [n, top_k + shared]
};
// At most kMaxRouteExperts experts and kMaxRouteGroups groups.
constexpr int kMaxRouteExperts = 1024;
constexpr int kMaxRouteGroups = 64;
void moe_route(const MoeRouteParams& p, cudaStream_t s);

// The most blocks of block_m rows `pairs` pairs over `experts` experts can fill once each
// expert's run is padded: grids and buffers are sized by it.
inline int64_t moe_max_blocks(int64_t pairs, int experts, int block_m) {
  return (pairs + block_m - 1) / block_m + (pairs < experts ? pairs : experts);
}

struct MoeAlignParams {
  const int32_t* ids = nullptr;  // [pairs] expert of each pair (pair = token * top_k + j)
  int64_t pairs = 0;
  int experts = 0, block_m = 0;
  int32_t* sorted = nullptr;        // [max_blocks * block_m]: a row's pair, or -1 (padding)
  int32_t* block_expert = nullptr;  // [max_blocks]: the expert of each block in use
  int32_t* slot = nullptr;          // [pairs]: the row of each pair
  int32_t* num_blocks = nullptr;    // [1]: blocks in use
};
void moe_align(const MoeAlignParams& p, cudaStream_t s);

// Tile shapes of moe_gemm: small blocks for decode (few rows per expert: what matters is
// reading each selected expert's weights once, at full bandwidth) and large ones for prefill.
enum class MoeTile { kSmall, kMedium, kLarge };
int moe_tile_rows(MoeTile tile);
// The tile for `pairs` pairs over `experts` experts (by the mean rows per expert).
MoeTile moe_pick_tile(int64_t pairs, int experts);

struct MoeGemmParams {
  // A: bf16 hi / lo rows of width k. gather: row r of the block list reads A row sorted[r] /
  // top_k (a token's activations); otherwise A row r itself.
  const void* a_hi = nullptr;
  const void* a_lo = nullptr;
  bool gather = false;
  int top_k = 1;
  const int32_t* sorted = nullptr;
  const int32_t* block_expert = nullptr;
  const int32_t* num_blocks = nullptr;
  int64_t max_blocks = 0;
  // B: bf16 [experts, n, k] (each expert's weights [out, in] row-major).
  const void* w = nullptr;
  int n = 0, k = 0;  // k a multiple of 8
  int experts = 0;   // w's first extent (the large and small tiles' tensor maps need it; 0: mma.sync)
  // Benchmarks: the large and small tiles on mma.sync, the kernels moe_gemm_wgmma and
  // moe_gemm_decode replaced.
  bool mma_sync = false;
  // moe_gemm_wgmma: A's extent (a_hi / a_lo hold [a_rows, k] in block-list order, gather false),
  // and whether blocks of neighbouring column tiles may pair up to share their rows' loads
  // (benchmarks turn it off to measure what it gains).
  int64_t a_rows = 0;
  bool cluster = true;
  // moe_gemm_decode's pipeline depth: 0 chooses by the grid; tests pin 3 or 5 to cover both.
  int decode_stages = 0;
  // fp8 weights: w holds e4m3 codes [experts, n, k] (k a multiple of 16) and w_scale f32
  // [experts, n, ceil(k / scale_k)], each row's scale per run of scale_k values (a multiple of
  // 16); the operand is bf16(code x scale), what a dequantization to bf16 on the host gives.
  const float* w_scale = nullptr;
  int scale_k = 0;
  // gate_up: w's rows interleave 32 gate rows and 32 up rows (n a multiple of 64); the output
  // is act = silu(gate) * up as bf16 hi / lo [rows, n / 2]. Otherwise f32 out [rows, n].
  bool gate_up = false;
  void* act_hi = nullptr;
  void* act_lo = nullptr;
  float* out = nullptr;
};
void moe_gemm(const MoeGemmParams& p, MoeTile tile, cudaStream_t s);
// The large tile on Hopper's warpgroup MMA, bf16 or fp8 weights (moe_gemm takes it there unless
// mma_sync or gather): 128 rows (the large tile's) by 256 columns, rows read in block-list order
// (moe_gather_split lays out gate|up's); a_lo null multiplies a_hi alone (bf16 activations;
// act_lo, when given, still receives the lo term).
void moe_gemm_wgmma(const MoeGemmParams& p, cudaStream_t s);
// The small tile on warpgroup MMA with the weights as the M side (64 columns x 16 rows a block),
// bf16 weights and hi / lo activations (moe_gemm takes it there unless mma_sync or fp8).
void moe_gemm_decode(const MoeGemmParams& p, cudaStream_t s);

// Row r of the block list (r < *num_blocks x block_m) as the hi and lo bf16 terms of its token's
// f32 activations (token sorted[r] / top_k), zeros for padding: the gate|up product's A in the
// order moe_gemm_wgmma reads it.
struct MoeGatherParams {
  const float* x = nullptr;  // [n, h]
  const int32_t* sorted = nullptr;
  const int32_t* num_blocks = nullptr;
  int block_m = 0, top_k = 1, h = 0;
  int64_t max_rows = 0;  // rows the launch covers (max_blocks x block_m)
  void* hi = nullptr;    // bf16 [max_rows, h]
  void* lo = nullptr;
};
void moe_gather_split(const MoeGatherParams& p, cudaStream_t s);

// At most this many experts per token (top-k and shared) in moe_combine.
constexpr int kMaxMoeTokenExperts = 32;

struct MoeCombineParams {
  const float* y = nullptr;       // [rows, hidden] the experts' outputs by row
  const int32_t* slot = nullptr;  // [n * top_k]
  const int32_t* ids = nullptr;   // [n * top_k] (the sum runs over a token's experts by index)
  const float* weights = nullptr;  // [n * top_k]
  float* out = nullptr;           // [n, hidden]
  int64_t n = 0;
  int hidden = 0, top_k = 0;
};
void moe_combine(const MoeCombineParams& p, cudaStream_t s);

}  // namespace specula::cuda_kernels
