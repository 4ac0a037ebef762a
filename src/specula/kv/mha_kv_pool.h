// MHAKVPool (SGLang's MHATokenToKVPool): per layer a K buffer [num_slots, num_kv_heads, head_dim]
// and a V buffer [num_slots, num_kv_heads, v_head_dim], in bf16, f16, f32 or fp8 e4m3. For fp8,
// each layer has a k_scale and v_scale: set_kv_buffer stores round(x / scale) (saturated to
// +-448, so an outlier cannot turn into NaN) and attention multiplies back by the scale
// ("descale").
#pragma once

#include <span>
#include <cstdint>
#include <vector>

#include "specula/core/tensor.h"

namespace specula {

struct KVPoolConfig {
  int64_t num_slots = 0;  // total slots, the reserved padding page included
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int v_head_dim = 0;  // 0 means head_dim
  DType dtype = DType::bf16;
  Device device = Device::cpu();
};

class MHAKVPool {
 public:
  explicit MHAKVPool(const KVPoolConfig& config);

  const KVPoolConfig& config() const { return config_; }
  int64_t num_slots() const { return config_.num_slots; }
  DType dtype() const { return config_.dtype; }
  int num_layers() const { return config_.num_layers; }

  TensorView k_buffer(int layer_id) const;  // [num_slots, num_kv_heads, head_dim]
  TensorView v_buffer(int layer_id) const;  // [num_slots, num_kv_heads, v_head_dim]

  // Scales are per layer; 1.0 unless set. Only fp8 pools use them.
  float k_scale(int layer_id) const;
  float v_scale(int layer_id) const;
  void set_kv_scales(int layer_id, float k_scale, float v_scale);

  // Writes k [n, num_kv_heads, head_dim] and v [n, num_kv_heads, v_head_dim] (f32, f16 or bf16)
  // to slots loc[0..n) of a layer, converting to the pool's dtype with round-to-nearest-even.
  void set_kv_buffer(int layer_id, std::span<const int32_t> loc, const TensorView& k, const TensorView& v);
  // The same for a pool on a CUDA device: loc is an i32 device tensor [n], k and v device
  // tensors; runs on cuda_stream (a cudaStream_t; nullptr: the default stream), no sync.
  void set_kv_buffer(int layer_id, const TensorView& loc, const TensorView& k, const TensorView& v, void* cuda_stream);

  // Copies the K and V of every layer from slot src[i] to slot dst[i], in order (speculative
  // decoding moves an accepted path into place). Host pools copy at once; device pools in one
  // launch on cuda_stream (a cudaStream_t), without a sync.
  void copy_slots(std::span<const int32_t> src, std::span<const int32_t> dst, void* cuda_stream = nullptr);

  size_t bytes_per_token() const;  // all layers, K and V

 private:
  void check_layer(int layer_id) const;

  KVPoolConfig config_;
  std::vector<Buffer> k_;
  std::vector<Buffer> v_;
  std::vector<float> k_scale_;
  std::vector<float> v_scale_;
  Buffer copy_tables_;  // device pools: each buffer's base pointer, then its row bytes (copy_slots)
  Buffer copy_moves_;   // device pools: copy_slots' source then destination slots
};

}  // namespace specula
