// The CUDA attention backend's selection functions: which kernel serves a call, its decode split
// plan and the workspace it needs, or why the call is not served.
#include "specula/attention/cuda/cuda_attention_select.h"

#include <algorithm>
#include <string>
#include <utility>

#include "specula/attention/cuda/kernels/attention_params.h"
#include "specula/attention/cuda/kernels/dual_chunk_sparse.h"
#include "specula/attention/cuda/kernels/prefill_wgmma.h"
#include "specula/attention/cuda/kernels/tree_attention.h"
#include "specula/core/error.h"

namespace specula {

namespace {

namespace ck = cuda_kernels;

constexpr int kSupportedHeadDims[] = {64, 80, 96, 128, 256};

int head_blocks(int num_q_heads, int num_kv_heads) {
  const int group = num_q_heads / num_kv_heads;
  return (group + ck::kDecodeHeadsPerBlock - 1) / ck::kDecodeHeadsPerBlock;
}

// What every CUDA attention kernel needs of a layer; empty when it is served.
std::string layer_problem(const AttentionLayer& layer, DType q_dtype, DType kv_dtype, const CudaAttentionShape& shape) {
  if (std::find(std::begin(kSupportedHeadDims), std::end(kSupportedHeadDims), layer.head_dim) == std::end(kSupportedHeadDims)) {
    return fmt::format("head_dim {} is not supported; supported: {}", layer.head_dim, fmt::join(kSupportedHeadDims, ", "));
  }
  if (layer.effective_v_head_dim() != layer.head_dim) {
    return fmt::format("v_head_dim {} differs from head_dim {}; the cuda backend needs them equal",
                       layer.effective_v_head_dim(), layer.head_dim);
  }
  if (std::string problem = common_layer_problem(layer); !problem.empty()) return problem;
  if (layer.dca_chunk_len > 0) {
    if (layer.attn_type != AttentionType::DECODER || layer.sliding_window_size >= 0 || layer.use_local_attention ||
        !layer.sinks.empty()) {
      return "dual chunk attention serves causal layers without sliding window, local chunks or sinks";
    }
    if (layer.dca_chunk_len % 16 != 0) {
      return fmt::format("dual chunk attention's chunk length {} must be a multiple of 16 on the cuda backend",
                         layer.dca_chunk_len);
    }
  }
  if (q_dtype != DType::bf16 && q_dtype != DType::f16) {
    return fmt::format("query dtype {} is not supported; supported: bf16, f16", dtype_name(q_dtype));
  }
  if (kv_dtype != DType::bf16 && kv_dtype != DType::f16 && kv_dtype != DType::fp8_e4m3) {
    return fmt::format("KV cache dtype {} is not supported; supported: bf16, f16, fp8_e4m3", dtype_name(kv_dtype));
  }
  if (shape.page_size < 1 || (shape.page_size & (shape.page_size - 1)) != 0) {
    return fmt::format("page_size {} is not supported; it must be a power of two >= 1", shape.page_size);
  }
  if (layer.use_local_attention && shape.attention_chunk_size <= 0) {
    return "it uses local attention but the backend has no attention_chunk_size";
  }
  return {};
}

CudaAttentionPlan unsupported(std::string reason) {
  CudaAttentionPlan plan;
  plan.unsupported_reason = std::move(reason);
  return plan;
}

}  // namespace

bool dense_rows(const TensorView& t, const AttentionLayer& layer) {
  return t.stride(2) == 1 && t.stride(1) == layer.head_dim &&
         t.stride(0) == static_cast<int64_t>(layer.num_q_heads) * layer.head_dim;
}

DecodePlan choose_decode_plan(int batch_size, int kv_head_blocks, int max_kv_len, int num_sms) {
  const int64_t blocks = static_cast<int64_t>(batch_size) * kv_head_blocks;
  if (blocks <= 0 || blocks >= num_sms) return {};
  DecodePlan plan;
  int64_t want = 0;
  if (2 * blocks <= num_sms) {
    // One wide block per multiprocessor (128 blocks at B=1 with 8 KV heads, so 4 of 132 idle).
    // H200, B=1 L=32768, cold L2, KV TB/s (page 16 / 64): 33 splits of 4 warps, two blocks per
    // multiprocessor, 2.94 / 2.98; 16 splits of 8 warps 3.06-3.10 / 3.12-3.13. Their key loops
    // end 30-36 us into the kernel, the 4-warp blocks' 18-37 us.
    plan.warps = ck::kDecodeWideWarps;
    want = num_sms / blocks;
  } else {
    // About two blocks per multiprocessor: what the 4-warp kernel keeps resident at head_dim
    // 96-128 with 16-bit caches (fp8 and smaller heads fit more, head_dim 256 one).
    want = (2 * static_cast<int64_t>(num_sms) + blocks - 1) / blocks;
  }
  const int64_t by_length = std::max<int64_t>(1, (max_kv_len + 255) / 256);
  plan.splits = static_cast<int>(std::clamp<int64_t>(std::min(want, by_length), 1, ck::kMaxDecodeSplits));
  if (plan.splits == 1) plan.warps = 4;
  return plan;
}

CudaAttentionPlan select_cuda_decode(const AttentionLayer& layer, DType q_dtype, DType kv_dtype,
                                     const CudaAttentionShape& shape) {
  if (std::string problem = layer_problem(layer, q_dtype, kv_dtype, shape); !problem.empty()) {
    return unsupported(std::move(problem));
  }
  CudaAttentionPlan plan;
  plan.kernel = CudaAttentionKernel::kDecode;
  const int kv_head_blocks = layer.num_kv_heads * head_blocks(layer.num_q_heads, layer.num_kv_heads);
  // Deterministic: the same split of every request's keys whatever the batch and its lengths.
  plan.decode = shape.deterministic ? choose_decode_plan(1, kv_head_blocks, shape.max_context_len, shape.num_sms)
                                    : choose_decode_plan(shape.batch_size, kv_head_blocks, shape.max_kv_len,
                                                         shape.num_sms);
  if (plan.decode.splits > 1) {
    plan.workspace.partial_rows = static_cast<int64_t>(plan.decode.splits) * shape.num_tokens * layer.num_q_heads;
    plan.workspace.partial_values = plan.workspace.partial_rows * layer.head_dim;
    plan.workspace.counters = shape.num_tokens * layer.num_q_heads;
  }
  return plan;
}

CudaAttentionPlan select_cuda_extend(const AttentionLayer& layer, DType q_dtype, DType kv_dtype,
                                     const CudaAttentionShape& shape) {
  if (std::string problem = layer_problem(layer, q_dtype, kv_dtype, shape); !problem.empty()) {
    return unsupported(std::move(problem));
  }
  if (layer.use_local_attention && shape.custom_mask) {
    return unsupported("local attention with a tree mask is not supported");
  }
  if (layer.dca_chunk_len > 0 && shape.custom_mask) {
    return unsupported("dual chunk attention with a tree mask (speculative verify) is not supported");
  }
  if (layer.dca_sparse != nullptr &&
      (layer.dca_sparse->last_q < 1 || layer.dca_sparse->last_q > ck::kMaxSparseEstimators)) {
    return unsupported(fmt::format("dual chunk attention's sparse_attention_last_q {} is not supported; 1 to {}",
                                   layer.dca_sparse->last_q, ck::kMaxSparseEstimators));
  }
  if (layer.dca_chunk_len > 0 && layer.dca_chunk_len % shape.page_size != 0) {
    return unsupported(fmt::format(
        "dual chunk attention's chunk length {} must be a multiple of page_size {} for the cuda backend's prefill",
        layer.dca_chunk_len, shape.page_size));
  }
  CudaAttentionPlan plan;
  // Warpgroup MMA where it is built (ck::prefill_wgmma_supports, which its launch asserts): a cache
  // of the query's own type, so tiles go to the tensor cores unconverted, at head_dim 64 and 128.
  const bool wgmma = kv_dtype == q_dtype && (layer.head_dim == 64 || layer.head_dim == 128);
  plan.kernel = wgmma ? CudaAttentionKernel::kPrefillWgmma : CudaAttentionKernel::kPrefillMma;
  const int64_t kv_bytes = shape.kv_rows * 2 * layer.head_dim * static_cast<int64_t>(dtype_size(kv_dtype));
  plan.heads_per_group = ck::prefill_head_group(kv_bytes, layer.num_q_heads, layer.num_kv_heads, shape.l2_bytes);
  return plan;
}

CudaAttentionPlan select_cuda_draft_tree(const AttentionLayer& layer, DType q_dtype, DType kv_dtype,
                                         const CudaAttentionShape& shape) {
  if (std::string problem = layer_problem(layer, q_dtype, kv_dtype, shape); !problem.empty()) {
    return unsupported(std::move(problem));
  }
  if (layer.dca_chunk_len > 0) return unsupported("the tree kernel does not serve dual chunk attention");
  // What kernels/tree_attention.cu is built for: plain softmax attention over bf16 or e4m3 rows.
  if (q_dtype != DType::bf16 || (kv_dtype != DType::bf16 && kv_dtype != DType::fp8_e4m3)) {
    return unsupported(fmt::format("the tree kernel needs bf16 queries and a bf16 or fp8_e4m3 KV cache; got {} and {}",
                                   dtype_name(q_dtype), dtype_name(kv_dtype)));
  }
  if (layer.head_dim != 64 && layer.head_dim != 128 && layer.head_dim != 256) {
    return unsupported(
        fmt::format("the tree kernel does not serve head_dim {}; it serves 64, 128, 256", layer.head_dim));
  }
  if (layer.logit_cap != 0.0f || !layer.sinks.empty() || layer.sliding_window_size >= 0 ||
      layer.use_local_attention || layer.attn_type != AttentionType::DECODER) {
    return unsupported(fmt::format(
        "the tree kernel serves causal layers without soft-cap, sinks, sliding window or local attention; this "
        "layer has logit_cap {}, {} sinks, sliding_window_size {}, use_local_attention {}, {}",
        layer.logit_cap, layer.sinks.size(), layer.sliding_window_size, layer.use_local_attention,
        layer.attn_type == AttentionType::DECODER ? "causal" : "non-causal"));
  }
  if (!shape.rows_contiguous) {
    return unsupported("the tree kernel needs q and the output dense [rows, num_q_heads, head_dim]");
  }
  CudaAttentionPlan plan;
  plan.kernel = CudaAttentionKernel::kTree;
  return plan;
}

CudaAttentionPlan select_cuda_verify(const AttentionLayer& layer, DType q_dtype, DType kv_dtype,
                                     const CudaAttentionShape& shape) {
  if (layer.dca_chunk_len > 0) return unsupported("dual chunk attention's speculative verify is not supported");
  if (shape.tree_staged) {
    CudaAttentionPlan tree = select_cuda_draft_tree(layer, q_dtype, kv_dtype, shape);
    if (tree.supported()) return tree;
    // Without the mask (staged only when some checked layer needs it) the prefill kernels cannot
    // take over.
    if (!shape.custom_mask) {
      return unsupported("this TARGET_VERIFY step was planned for the tree kernel, which cannot serve the layer: " +
                         tree.unsupported_reason);
    }
  }
  return select_cuda_extend(layer, q_dtype, kv_dtype, shape);
}

}  // namespace specula
