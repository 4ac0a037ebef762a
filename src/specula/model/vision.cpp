#include "specula/model/vision.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "specula/batch/forward_batch.h"
#include "specula/core/error.h"
#include "specula/kv/mha_kv_pool.h"
#include "specula/kv/req_to_token_pool.h"
#include "specula/model/cpu_ops.h"

namespace specula {

VisionLayout vision_layout(std::span<const VisionGrid> grids, int spatial_merge_size) {
  SPECULA_CHECK(spatial_merge_size >= 1, "spatial_merge_size {} is not allowed; it must be >= 1", spatial_merge_size);
  VisionLayout layout;
  layout.cu_seqlens.push_back(0);
  const int m = spatial_merge_size;
  for (size_t g = 0; g < grids.size(); ++g) {
    const VisionGrid& grid = grids[g];
    SPECULA_CHECK(grid.t >= 1 && grid.h >= 1 && grid.w >= 1,
                  "vision grid {} is (t={}, h={}, w={}); every size must be >= 1", g, grid.t, grid.h, grid.w);
    SPECULA_CHECK(grid.h % m == 0 && grid.w % m == 0,
                  "vision grid {} is (t={}, h={}, w={}); h and w must be multiples of spatial_merge_size {}", g,
                  grid.t, grid.h, grid.w, m);
    const int64_t frame = static_cast<int64_t>(grid.h) * grid.w;
    SPECULA_CHECK(layout.cu_seqlens.back() + frame * grid.t <= INT32_MAX,
                  "vision grids hold more than {} patches", INT32_MAX);
    for (int t = 0; t < grid.t; ++t) {
      for (int wr = 0; wr < grid.h / m; ++wr) {
        for (int wc = 0; wc < grid.w / m; ++wc) {
          for (int r = 0; r < m; ++r) {
            for (int c = 0; c < m; ++c) {
              layout.row.push_back(wr * m + r);
              layout.col.push_back(wc * m + c);
            }
          }
        }
      }
      layout.cu_seqlens.push_back(layout.cu_seqlens.back() + static_cast<int32_t>(frame));
    }
  }
  return layout;
}

void check_cu_seqlens(std::span<const int32_t> cu_seqlens, int64_t num_patches) {
  SPECULA_CHECK(!cu_seqlens.empty() && cu_seqlens.front() == 0, "cu_seqlens must start at 0");
  for (size_t i = 1; i < cu_seqlens.size(); ++i) {
    SPECULA_CHECK(cu_seqlens[i] >= cu_seqlens[i - 1], "cu_seqlens[{}] = {} is below cu_seqlens[{}] = {}", i,
                  cu_seqlens[i], i - 1, cu_seqlens[i - 1]);
  }
  SPECULA_CHECK(cu_seqlens.back() == num_patches, "cu_seqlens ends at {} but there are {} patches",
                cu_seqlens.back(), num_patches);
}

VisionRopeTables vision_rope_tables(const VisionLayout& layout, int head_dim, float theta) {
  SPECULA_CHECK(head_dim >= 4 && head_dim % 4 == 0,
                "vision head_dim {} is not allowed; the 2D rotary embedding needs a positive multiple of 4", head_dim);
  SPECULA_CHECK(theta > 0.0f, "vision rope theta {} is not allowed; it must be > 0", theta);
  // VisionRotaryEmbedding(dim = head_dim / 2): inv_freq = 1 / theta^(2i / dim), i < dim / 2.
  const int dim = head_dim / 2;
  std::vector<float> inv_freq(static_cast<size_t>(dim / 2));
  for (int i = 0; i < dim / 2; ++i) {
    inv_freq[static_cast<size_t>(i)] =
        1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(dim));
  }
  VisionRopeTables tables;
  tables.head_dim = head_dim;
  const int64_t n = layout.num_patches();
  tables.cos.resize(static_cast<size_t>(n * head_dim));
  tables.sin.resize(static_cast<size_t>(n * head_dim));
  for (int64_t p = 0; p < n; ++p) {
    float* cos_row = tables.cos.data() + p * head_dim;
    float* sin_row = tables.sin.data() + p * head_dim;
    for (int i = 0; i < dim; ++i) {
      const int axis_pos = i < dim / 2 ? layout.row[static_cast<size_t>(p)] : layout.col[static_cast<size_t>(p)];
      // The angle is an f32 product, as torch.outer over f32 positions and inv_freq gives it.
      const float angle = static_cast<float>(axis_pos) * inv_freq[static_cast<size_t>(i % (dim / 2))];
      cos_row[i] = cos_row[i + dim] = std::cos(angle);
      sin_row[i] = sin_row[i + dim] = std::sin(angle);
    }
  }
  return tables;
}

void apply_vision_rope(float* x, int64_t n, int heads, const VisionRopeTables& tables) {
  const int d = tables.head_dim;
  const int half = d / 2;
  SPECULA_CHECK(static_cast<int64_t>(tables.cos.size()) == n * d,
                "vision rope tables hold {} patches but the tensor has {}", tables.cos.size() / static_cast<size_t>(d), n);
  std::vector<float> rotated(static_cast<size_t>(d));
  for (int64_t p = 0; p < n; ++p) {
    const float* c = tables.cos.data() + p * d;
    const float* s = tables.sin.data() + p * d;
    for (int h = 0; h < heads; ++h) {
      float* row = x + (p * heads + h) * d;
      for (int i = 0; i < half; ++i) {
        rotated[static_cast<size_t>(i)] = -row[i + half];
        rotated[static_cast<size_t>(i + half)] = row[i];
      }
      for (int i = 0; i < d; ++i) row[i] = row[i] * c[i] + rotated[static_cast<size_t>(i)] * s[i];
    }
  }
}

VisionAttention::VisionAttention(AttentionBackend& backend, AttentionLayer layer, DType q_dtype, DType kv_dtype,
                                 Device device, int page_size)
    : backend_(backend),
      layer_(std::move(layer)),
      q_dtype_(q_dtype),
      kv_dtype_(kv_dtype),
      device_(device),
      page_size_(page_size) {
  SPECULA_CHECK(page_size_ >= 1, "page_size {} is not allowed; it must be >= 1", page_size_);
  layer_.attn_type = AttentionType::ENCODER_ONLY;
  layer_.layer_id = 0;
  backend_.check_layer(layer_, q_dtype, kv_dtype_);
}

VisionAttention::~VisionAttention() = default;

void VisionAttention::reserve(int64_t slots, int sequences, int longest) {
  if (!pool_ || pool_->num_slots() < slots) {
    // Grown by half again, so a stream of slightly larger batches does not reallocate each time.
    const int64_t want = std::max(slots, pool_ ? pool_->num_slots() * 3 / 2 : slots);
    pool_ = std::make_unique<MHAKVPool>(KVPoolConfig{want, 1, layer_.num_kv_heads, layer_.head_dim,
                                                     layer_.effective_v_head_dim(), kv_dtype_, device_});
  }
  if (!rows_ || rows_->size() < sequences || rows_->max_context_len() < longest) {
    rows_ = std::make_unique<ReqToTokenPool>(std::max(sequences, rows_ ? rows_->size() : 0),
                                             std::max(longest, rows_ ? rows_->max_context_len() : 0));
  }
}

void VisionAttention::forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                              std::span<const int32_t> cu_seqlens) {
  SPECULA_CHECK(q.shape().rank() == 3, "vision q {} is not [patches, heads, head_dim]", q.shape().str());
  const int64_t n = q.size(0);
  check_cu_seqlens(cu_seqlens, n);
  check_device(q, device_, "vision q");
  check_dtype(q, q_dtype_, "vision q");
  ForwardBatch batch;
  batch.forward_mode = ForwardMode::EXTEND;
  int64_t slots = page_size_;  // page 0 is the pool's reserved padding page
  int longest = 1;
  for (size_t i = 1; i < cu_seqlens.size(); ++i) {
    const int len = cu_seqlens[i] - cu_seqlens[i - 1];
    if (len == 0) continue;  // an empty window attends to nothing and writes nothing
    slots += (len + page_size_ - 1) / page_size_ * page_size_;
    longest = std::max(longest, len);
    ++batch.batch_size;
  }
  if (batch.batch_size == 0) return;
  reserve(slots, batch.batch_size, longest);

  // Sequence s's patches take contiguous whole pages from slot `base`, in patch order, so
  // out_cache_loc lists the patches in the order q holds them.
  int64_t base = page_size_;
  int row = 0;
  std::vector<int32_t> seq_slots;
  for (size_t i = 1; i < cu_seqlens.size(); ++i) {
    const int len = cu_seqlens[i] - cu_seqlens[i - 1];
    if (len == 0) continue;
    seq_slots.resize(static_cast<size_t>(len));
    for (int t = 0; t < len; ++t) seq_slots[static_cast<size_t>(t)] = static_cast<int32_t>(base + t);
    rows_->write(row, 0, seq_slots);
    batch.req_pool_indices.push_back(row++);
    batch.seq_lens.push_back(len);
    batch.extend_prefix_lens.push_back(0);
    batch.extend_seq_lens.push_back(len);
    batch.out_cache_loc.insert(batch.out_cache_loc.end(), seq_slots.begin(), seq_slots.end());
    for (int t = 0; t < len; ++t) batch.positions.push_back(t);
    base += (len + page_size_ - 1) / page_size_ * page_size_;
  }
  batch.req_to_token_pool = rows_.get();
  batch.token_to_kv_pool = pool_.get();
  backend_.init_forward_metadata(batch);
  backend_.forward_extend(q, k, v, out, layer_, batch, ForwardOptions{});
}

void VisionBlockWeights::check() const {
  SPECULA_CHECK(hidden > 0 && heads > 0 && mlp > 0 && hidden % heads == 0,
                "vision block hidden {} heads {} mlp {}: all must be positive and hidden a multiple of heads", hidden,
                heads, mlp);
  const auto h = static_cast<size_t>(hidden);
  const auto f = static_cast<size_t>(mlp);
  const std::pair<const std::vector<float>*, size_t> expected[] = {
      {&norm1_w, h}, {&norm1_b, h}, {&qkv_w, 3 * h * h}, {&qkv_b, 3 * h}, {&proj_w, h * h}, {&proj_b, h},
      {&norm2_w, h}, {&norm2_b, h}, {&fc1_w, f * h},     {&fc1_b, f},     {&fc2_w, h * f},  {&fc2_b, h}};
  constexpr const char* kNames[] = {"norm1.weight", "norm1.bias", "attn.qkv.weight", "attn.qkv.bias",
                                    "attn.proj.weight", "attn.proj.bias", "norm2.weight", "norm2.bias",
                                    "mlp.fc1.weight", "mlp.fc1.bias", "mlp.fc2.weight", "mlp.fc2.bias"};
  for (size_t i = 0; i < std::size(expected); ++i) {
    SPECULA_CHECK(expected[i].first->size() == expected[i].second, "vision block {} has {} values; expected {}",
                  kNames[i], expected[i].first->size(), expected[i].second);
  }
}

namespace {

// y = (x - mean) / sqrt(var + eps) * w + b per row, in f32 as torch.nn.LayerNorm.
void layer_norm(const float* x, const std::vector<float>& w, const std::vector<float>& b, float* y, int64_t n,
                int width, float eps) {
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x + r * width;
    float mean = 0.0f;
    for (int i = 0; i < width; ++i) mean += xr[i];
    mean /= static_cast<float>(width);
    float var = 0.0f;
    for (int i = 0; i < width; ++i) var += (xr[i] - mean) * (xr[i] - mean);
    const float inv = 1.0f / std::sqrt(var / static_cast<float>(width) + eps);
    float* yr = y + r * width;
    for (int i = 0; i < width; ++i) yr[i] = (xr[i] - mean) * inv * w[static_cast<size_t>(i)] + b[static_cast<size_t>(i)];
  }
}

// f32 host values as a tensor of the given dtype on the device.
Buffer to_device(const std::vector<float>& values, DType dtype, Device device, const Shape& shape) {
  Buffer host(dtype, shape);
  convert_from_float(values.data(), host.data(), dtype, values.size());
  if (device.is_cpu()) return host;
  Buffer dev(dtype, shape, device);
  copy(dev, host);
  return dev;
}

}  // namespace

void vision_block_forward(const VisionBlockWeights& w, std::vector<float>& x, const VisionLayout& layout,
                          const VisionRopeTables& rope, VisionAttention& attention) {
  w.check();
  const int64_t n = layout.num_patches();
  const int hidden = w.hidden;
  const int head_dim = hidden / w.heads;
  SPECULA_CHECK(static_cast<int64_t>(x.size()) == n * hidden, "vision block input has {} values; expected {} x {}",
                x.size(), n, hidden);
  SPECULA_CHECK(rope.head_dim == head_dim, "vision rope tables are for head_dim {} but the block's is {}",
                rope.head_dim, head_dim);
  const AttentionLayer& layer = attention.layer();
  SPECULA_CHECK(layer.num_q_heads == w.heads && layer.num_kv_heads == w.heads && layer.head_dim == head_dim,
                "vision attention has {} heads of {} but the block {} of {}", layer.num_q_heads, layer.head_dim,
                w.heads, head_dim);

  std::vector<float> normed(x.size());
  layer_norm(x.data(), w.norm1_w, w.norm1_b, normed.data(), n, hidden, w.eps);
  std::vector<float> qkv(static_cast<size_t>(n) * 3 * hidden);
  cpu_linear(normed.data(), w.qkv_w, qkv.data(), n, hidden, 3 * hidden);
  cpu_add_bias(qkv.data(), w.qkv_b, n);
  // qkv rows are [3, heads, head_dim]: split, then rotate q and k.
  std::vector<float> q(x.size()), k(x.size()), v(x.size());
  for (int64_t p = 0; p < n; ++p) {
    const float* src = qkv.data() + p * 3 * hidden;
    std::copy(src, src + hidden, q.data() + p * hidden);
    std::copy(src + hidden, src + 2 * hidden, k.data() + p * hidden);
    std::copy(src + 2 * hidden, src + 3 * hidden, v.data() + p * hidden);
  }
  apply_vision_rope(q.data(), n, w.heads, rope);
  apply_vision_rope(k.data(), n, w.heads, rope);

  // The attention runs in the backend's query dtype on its device.
  const DType dtype = attention.query_dtype();
  const Device device = attention.device();
  const Shape shape{n, w.heads, head_dim};
  Buffer qd = to_device(q, dtype, device, shape);
  Buffer kd = to_device(k, dtype, device, shape);
  Buffer vd = to_device(v, dtype, device, shape);
  Buffer od(dtype, shape, device);
  attention.forward(qd, kd, vd, od, layout.cu_seqlens);
  Buffer oh(dtype, shape);
  copy(oh, od);
  std::vector<float> attn(x.size());
  convert_to_float(oh.data(), dtype, attn.data(), attn.size());

  std::vector<float> projected(x.size());
  cpu_linear(attn.data(), w.proj_w, projected.data(), n, hidden, hidden);
  cpu_add_bias(projected.data(), w.proj_b, n);
  for (size_t i = 0; i < x.size(); ++i) x[i] += projected[i];

  layer_norm(x.data(), w.norm2_w, w.norm2_b, normed.data(), n, hidden, w.eps);
  std::vector<float> up(static_cast<size_t>(n) * w.mlp);
  cpu_linear(normed.data(), w.fc1_w, up.data(), n, hidden, w.mlp);
  cpu_add_bias(up.data(), w.fc1_b, n);
  for (float& u : up) u = u / (1.0f + std::exp(-1.702f * u));  // QuickGELU: u * sigmoid(1.702 u)
  cpu_linear(up.data(), w.fc2_w, projected.data(), n, w.mlp, hidden);
  cpu_add_bias(projected.data(), w.fc2_b, n);
  for (size_t i = 0; i < x.size(); ++i) x[i] += projected[i];
}

}  // namespace specula
