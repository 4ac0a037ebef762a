// Vision-tower attention (the seeds' layers/attention/vision.py) as Qwen2-VL's ViT uses it:
// patches of several images packed into one sequence, each image attending to itself only
// (non-causal, variable length over cu_seqlens), after a 2D rotary embedding of each patch's
// (row, column) in its image.
//
// The attention itself goes through an AttentionBackend (CPU or CUDA): every image is one
// ENCODER_ONLY extend request over a scratch KV pool, so the vision tower uses the same kernels,
// page sizes and KV dtypes as the decoder. Qwen2.5-VL's windowed layers are the same call with
// the windows' cu_seqlens.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "specula/attention/backend.h"
#include "specula/core/tensor.h"

namespace specula {

class ReqToTokenPool;

// One image (t = 1) or video (t frames) in patches: Hugging Face's image_grid_thw row.
struct VisionGrid {
  int t = 1;
  int h = 0;
  int w = 0;
};

// The packed patch sequence of a batch of grids.
struct VisionLayout {
  std::vector<int32_t> cu_seqlens;  // [num_sequences + 1]: one sequence per frame, as Qwen2-VL does
  std::vector<int32_t> row, col;    // [num_patches]: each patch's position in its frame
  int64_t num_patches() const { return static_cast<int64_t>(row.size()); }
};

// Qwen2-VL's patch order: frames one after another, inside a frame spatial_merge_size x
// spatial_merge_size windows in raster order and the patches of a window in raster order (the
// merger later joins each window into one token). Throws specula::Error naming the grid when a
// size is not positive or h, w are not multiples of spatial_merge_size.
VisionLayout vision_layout(std::span<const VisionGrid> grids, int spatial_merge_size);

// cu_seqlens checked: starts at 0, never decreases, ends at num_patches. Throws specula::Error.
void check_cu_seqlens(std::span<const int32_t> cu_seqlens, int64_t num_patches);

// The 2D rotary tables [num_patches, head_dim] (VisionRotaryEmbedding(head_dim / 2, theta)): the
// first head_dim / 4 angles are row * inv_freq, the next head_dim / 4 col * inv_freq, and the
// table repeats those head_dim / 2 angles twice, for rotate-half. f32, as Hugging Face computes
// them. Throws specula::Error when head_dim is not a positive multiple of 4.
struct VisionRopeTables {
  std::vector<float> cos, sin;
  int head_dim = 0;
};
VisionRopeTables vision_rope_tables(const VisionLayout& layout, int head_dim, float theta = 10000.0f);

// x [n, heads, head_dim] (f32, contiguous) = x * cos + rotate_half(x) * sin, per patch.
void apply_vision_rope(float* x, int64_t n, int heads, const VisionRopeTables& tables);

// Non-causal attention of each cu_seqlens range with itself through an attention backend.
class VisionAttention {
 public:
  // layer: the heads and scaling (attn_type is set to ENCODER_ONLY); kv_dtype: the scratch pool's
  // dtype; device: where q, k, v and out live (the backend's device); page_size: the backend's.
  // Throws specula::Error when the backend cannot serve the layer with these dtypes.
  VisionAttention(AttentionBackend& backend, AttentionLayer layer, DType q_dtype, DType kv_dtype, Device device,
                  int page_size);
  ~VisionAttention();

  // q [n, num_q_heads, head_dim], k and v [n, num_kv_heads, head_dim], out [n, num_q_heads,
  // head_dim], on the device, q's dtype; cu_seqlens on the host. Rotary embeddings are the
  // caller's (apply them before). Runs on the backend's stream.
  void forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
               std::span<const int32_t> cu_seqlens);

  const AttentionLayer& layer() const { return layer_; }
  DType query_dtype() const { return q_dtype_; }
  Device device() const { return device_; }

 private:
  void reserve(int64_t slots, int sequences, int longest);

  AttentionBackend& backend_;
  AttentionLayer layer_;
  DType q_dtype_;
  DType kv_dtype_;
  Device device_;
  int page_size_;
  std::unique_ptr<MHAKVPool> pool_;
  std::unique_ptr<ReqToTokenPool> rows_;
};

// A Qwen2-VL vision block in f32 on the host (LayerNorm -> qkv -> 2D RoPE -> attention -> proj,
// then LayerNorm -> fc1 -> QuickGELU -> fc2, each with a residual), its attention through a
// VisionAttention of either device (its q, k, v cross to the device in the attention's dtype).
struct VisionBlockWeights {
  int hidden = 0, heads = 0, mlp = 0;
  float eps = 1e-6f;
  std::vector<float> norm1_w, norm1_b, qkv_w, qkv_b, proj_w, proj_b;  // qkv_w [3 * hidden, hidden]
  std::vector<float> norm2_w, norm2_b, fc1_w, fc1_b, fc2_w, fc2_b;    // fc1_w [mlp, hidden]
  // Throws specula::Error naming the first tensor whose size disagrees with hidden/heads/mlp.
  void check() const;
};

// x [num_patches, hidden] in place.
void vision_block_forward(const VisionBlockWeights& w, std::vector<float>& x, const VisionLayout& layout,
                          const VisionRopeTables& rope, VisionAttention& attention);

}  // namespace specula
