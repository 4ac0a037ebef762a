// MHAKVPool implementation. The write path converts row by row: one row is num_kv_heads *
// head_dim contiguous values, both in the source and in the cache.
#include "specula/kv/mha_kv_pool.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#ifdef SPECULA_HAS_CUDA
#include "specula/core/dtype_code.h"
#include "specula/kv/cuda/copy_slots.h"
#include "specula/kv/cuda/set_kv_buffer.h"
#include "specula/core/cuda_check.h"
#endif

namespace specula {

MHAKVPool::MHAKVPool(const KVPoolConfig& config) : config_(config) {
  if (config_.v_head_dim == 0) config_.v_head_dim = config_.head_dim;
  const DType d = config_.dtype;
  SPECULA_CHECK(d == DType::bf16 || d == DType::f16 || d == DType::f32 || d == DType::fp8_e4m3,
                "KV cache dtype {} is not supported; supported: bf16, f16, f32, fp8_e4m3", dtype_name(d));
  SPECULA_CHECK(config_.num_slots >= 1 && config_.num_layers >= 1 && config_.num_kv_heads >= 1 &&
                    config_.head_dim >= 1 && config_.v_head_dim >= 1,
                "KV pool sizes must be positive: num_slots {}, num_layers {}, num_kv_heads {}, "
                "head_dim {}, v_head_dim {}", config_.num_slots, config_.num_layers,
                config_.num_kv_heads, config_.head_dim, config_.v_head_dim);
  SPECULA_CHECK(config_.num_slots <= INT32_MAX, "KV pool of {} slots exceeds the 32-bit slot range",
                config_.num_slots);
  for (int l = 0; l < config_.num_layers; ++l) {
    k_.emplace_back(d, Shape{config_.num_slots, config_.num_kv_heads, config_.head_dim}, config_.device);
    v_.emplace_back(d, Shape{config_.num_slots, config_.num_kv_heads, config_.v_head_dim}, config_.device);
    // Zeroed so the padding page and never-written slots hold finite values.
    k_.back().zero();
    v_.back().zero();
  }
  k_scale_.assign(static_cast<size_t>(config_.num_layers), 1.0f);
  v_scale_.assign(static_cast<size_t>(config_.num_layers), 1.0f);
}

void MHAKVPool::check_layer(int layer_id) const {
  SPECULA_CHECK(layer_id >= 0 && layer_id < config_.num_layers, "layer_id {} is out of range [0, {})",
                layer_id, config_.num_layers);
}

TensorView MHAKVPool::k_buffer(int layer_id) const {
  check_layer(layer_id);
  return k_[static_cast<size_t>(layer_id)].view();
}

TensorView MHAKVPool::v_buffer(int layer_id) const {
  check_layer(layer_id);
  return v_[static_cast<size_t>(layer_id)].view();
}

float MHAKVPool::k_scale(int layer_id) const {
  check_layer(layer_id);
  return k_scale_[static_cast<size_t>(layer_id)];
}

float MHAKVPool::v_scale(int layer_id) const {
  check_layer(layer_id);
  return v_scale_[static_cast<size_t>(layer_id)];
}

void MHAKVPool::set_kv_scales(int layer_id, float k_scale, float v_scale) {
  check_layer(layer_id);
  SPECULA_CHECK(std::isfinite(k_scale) && k_scale > 0 && std::isfinite(v_scale) && v_scale > 0,
                "KV scales must be finite and positive; got k_scale {} v_scale {}", k_scale, v_scale);
  k_scale_[static_cast<size_t>(layer_id)] = k_scale;
  v_scale_[static_cast<size_t>(layer_id)] = v_scale;
}

size_t MHAKVPool::bytes_per_token() const {
  return static_cast<size_t>(config_.num_layers) * config_.num_kv_heads *
         (config_.head_dim + config_.v_head_dim) * dtype_size(config_.dtype);
}

namespace {

void write_rows(const TensorView& cache, std::span<const int32_t> loc, const TensorView& src, float scale) {
  const int64_t row = cache.size(1) * cache.size(2);
  const size_t elem = dtype_size(cache.dtype());
  const size_t src_elem = dtype_size(src.dtype());
  const bool quantise = cache.dtype() == DType::fp8_e4m3;
  std::vector<float> tmp(static_cast<size_t>(row));
  for (size_t i = 0; i < loc.size(); ++i) {
    const char* src_row = static_cast<const char*>(src.data()) + static_cast<int64_t>(i) * src.stride(0) * static_cast<int64_t>(src_elem);
    char* dst = static_cast<char*>(cache.data()) + static_cast<int64_t>(loc[i]) * row * static_cast<int64_t>(elem);
    if (cache.dtype() == src.dtype()) {
      std::memcpy(dst, src_row, static_cast<size_t>(row) * elem);
      continue;
    }
    convert_to_float(src_row, src.dtype(), tmp.data(), static_cast<size_t>(row));
    if (quantise) {
      for (float& x : tmp) x = std::clamp(x / scale, -kFp8E4m3Max, kFp8E4m3Max);
    }
    convert_from_float(tmp.data(), dst, cache.dtype(), static_cast<size_t>(row));
  }
}

}  // namespace

void MHAKVPool::set_kv_buffer(int layer_id, std::span<const int32_t> loc, const TensorView& k, const TensorView& v) {
  check_layer(layer_id);
  SPECULA_CHECK(config_.device.is_cpu(), "set_kv_buffer on {} needs the CUDA backend's write kernel",
                config_.device.str());
  const int64_t n = static_cast<int64_t>(loc.size());
  check_shape(k, {n, config_.num_kv_heads, config_.head_dim}, "set_kv_buffer k");
  check_shape(v, {n, config_.num_kv_heads, config_.v_head_dim}, "set_kv_buffer v");
  for (const TensorView* t : {&k, &v}) {
    check_device(*t, Device::cpu(), "set_kv_buffer input");
    SPECULA_CHECK(t->dtype() == DType::f32 || t->dtype() == DType::bf16 || t->dtype() == DType::f16,
                  "set_kv_buffer input dtype {} is not supported; supported: f32, bf16, f16",
                  dtype_name(t->dtype()));
    SPECULA_CHECK(t->stride(2) == 1 && t->stride(1) == t->size(2), "set_kv_buffer input {} must have "
                  "contiguous rows", t->str());
  }
  for (size_t i = 0; i < loc.size(); ++i) {
    SPECULA_CHECK(loc[i] >= 0 && loc[i] < config_.num_slots, "cache location {} (token {}) is out of "
                  "range [0, {})", loc[i], i, config_.num_slots);
  }
  write_rows(k_[static_cast<size_t>(layer_id)].view(), loc, k, k_scale(layer_id));
  write_rows(v_[static_cast<size_t>(layer_id)].view(), loc, v, v_scale(layer_id));
}

void MHAKVPool::set_kv_buffer(int layer_id, const TensorView& loc, const TensorView& k, const TensorView& v,
                              void* cuda_stream) {
  check_layer(layer_id);
  SPECULA_CHECK(config_.device.is_cuda(), "this set_kv_buffer is for CUDA pools; the pool is on {}", config_.device.str());
  const int64_t n = loc.numel();
  check_dtype(loc, DType::i32, "set_kv_buffer loc");
  check_shape(k, {n, config_.num_kv_heads, config_.head_dim}, "set_kv_buffer k");
  check_shape(v, {n, config_.num_kv_heads, config_.v_head_dim}, "set_kv_buffer v");
  for (const TensorView* t : {&loc, &k, &v}) check_device(*t, config_.device, "set_kv_buffer input");
  SPECULA_CHECK(k.dtype() == v.dtype() && (k.dtype() == DType::f32 || k.dtype() == DType::bf16 || k.dtype() == DType::f16),
                "set_kv_buffer input dtype {} / {} is not supported; supported: f32, bf16, f16", dtype_name(k.dtype()),
                dtype_name(v.dtype()));
  SPECULA_CHECK(k.stride(2) == 1 && k.stride(1) == config_.head_dim && v.stride(2) == 1 && v.stride(1) == config_.v_head_dim,
                "set_kv_buffer inputs {} / {} need contiguous rows", k.str(), v.str());
#ifdef SPECULA_HAS_CUDA
  cuda_kernels::SetKVParams p{};
  p.k = k.data();
  p.v = v.data();
  p.k_stride = k.stride(0);
  p.v_stride = v.stride(0);
  p.src_dtype = kernel_dtype_code(k.dtype());
  p.k_cache = k_buffer(layer_id).data();
  p.v_cache = v_buffer(layer_id).data();
  p.cache_dtype = kernel_dtype_code(config_.dtype);
  p.loc = loc.data_as<const int32_t>();
  p.num_tokens = n;
  p.row_k = config_.num_kv_heads * config_.head_dim;
  p.row_v = config_.num_kv_heads * config_.v_head_dim;
  p.k_scale = k_scale(layer_id);
  p.v_scale = v_scale(layer_id);
  cuda_kernels::launch_set_kv_buffer(p, static_cast<cudaStream_t>(cuda_stream));
#else
  (void)cuda_stream;
#endif
}

void MHAKVPool::copy_slots(std::span<const int32_t> src, std::span<const int32_t> dst, void* cuda_stream) {
  SPECULA_CHECK(src.size() == dst.size(), "copy_slots: {} sources but {} destinations", src.size(), dst.size());
  std::vector<int32_t> moves;  // src then dst of the moves that change anything
  for (size_t i = 0; i < src.size(); ++i) {
    SPECULA_CHECK(src[i] >= 0 && src[i] < config_.num_slots && dst[i] >= 0 && dst[i] < config_.num_slots,
                  "copy_slots: slot {} -> {} is outside [0, {})", src[i], dst[i], config_.num_slots);
  }
  if (src.empty()) return;
  if (config_.device.is_cpu()) {
    for (size_t i = 0; i < src.size(); ++i) {
      if (src[i] == dst[i]) continue;
      for (int l = 0; l < config_.num_layers; ++l) {
        for (const Buffer* b : {&k_[static_cast<size_t>(l)], &v_[static_cast<size_t>(l)]}) {
          copy(b->view().slice(dst[i], 1), b->view().slice(src[i], 1));
        }
      }
    }
    return;
  }
#ifdef SPECULA_HAS_CUDA
  const auto stream = static_cast<cudaStream_t>(cuda_stream);
  if (copy_tables_.data() == nullptr) {
    // Every buffer's base pointer and row size, uploaded once.
    std::vector<int64_t> table;
    for (int l = 0; l < config_.num_layers; ++l) {
      for (const Buffer* b : {&k_[static_cast<size_t>(l)], &v_[static_cast<size_t>(l)]}) {
        table.push_back(reinterpret_cast<int64_t>(b->data()));
      }
    }
    for (int l = 0; l < config_.num_layers; ++l) {
      table.push_back(static_cast<int64_t>(k_[static_cast<size_t>(l)].nbytes() / static_cast<size_t>(config_.num_slots)));
      table.push_back(static_cast<int64_t>(v_[static_cast<size_t>(l)].nbytes() / static_cast<size_t>(config_.num_slots)));
    }
    copy_tables_ = Buffer(DType::i64, {static_cast<int64_t>(table.size())}, config_.device);
    CUDA_CHECK(cudaMemcpy(copy_tables_.data(), table.data(), table.size() * sizeof(int64_t), cudaMemcpyHostToDevice));
  }
  moves.assign(src.begin(), src.end());
  moves.insert(moves.end(), dst.begin(), dst.end());
  const auto n = static_cast<int64_t>(src.size());
  if (copy_moves_.data() == nullptr || copy_moves_.numel() < 2 * n) copy_moves_ = Buffer(DType::i32, {2 * n}, config_.device);
  CUDA_CHECK(cudaMemcpyAsync(copy_moves_.data(), moves.data(), moves.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
  cuda_kernels::CopySlotsParams p{};
  const int buffers = 2 * config_.num_layers;
  p.buffers = reinterpret_cast<void* const*>(copy_tables_.data());
  p.row_bytes = copy_tables_.data_as<const int64_t>() + buffers;
  p.num_buffers = buffers;
  p.src = copy_moves_.data_as<const int32_t>();
  p.dst = copy_moves_.data_as<const int32_t>() + n;
  p.num_moves = static_cast<int32_t>(n);
  cuda_kernels::launch_copy_slots(p, stream);
  // The host vector is pageable, so the upload above was staged before the call returned.
#else
  (void)cuda_stream;
#endif
}

}  // namespace specula
