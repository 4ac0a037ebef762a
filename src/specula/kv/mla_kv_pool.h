// MLAKVPool (SGLang's MLATokenToKVPool, vLLM's fp8_ds_mla cache): per layer one latent row per
// token slot, the compressed KV (kv_lora_rank values, one KV head) followed by the RoPE key
// (qk_rope_head_dim values). Two formats:
//   bf16:       kv_lora_rank + qk_rope_head_dim bf16 values (1152 bytes at 512 + 64);
//   fp8_ds_mla: kv_lora_rank fp8 e4m3 values, then kv_lora_rank / 128 f32 scales (one per 128
//               values), then qk_rope_head_dim bf16 values (656 bytes at 512 + 64). RoPE stays
//               bf16 because position information does not survive 3 mantissa bits.
// Optionally (index_head_dim > 0) each layer also keeps the lightning indexer's key per slot:
// index_head_dim fp8 e4m3 values and one f32 scale (sparse MLA, DeepSeek-V3.2).
//
// Quantisation (both the fp8 latent tiles and the index keys), identical on CPU and GPU:
//   scale = max|x| / 448 over the tile (1 when that is zero: an all-zero tile, or a subnormal max
//   whose division underflows, where x / scale would be 0 / 0); stored = e4m3(x / scale),
//   round-to-nearest-even, saturated to +-448. Dequantisation is float(e4m3) * scale in f32.
//   fp8_ds_mla needs kv_lora_rank a multiple of 128 and an even qk_rope_head_dim (rows a whole
//   number of 4-byte words, so the f32 scales are aligned); index_head_dim is 0 or a multiple of 16.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "specula/core/tensor.h"

namespace specula {

enum class MlaKVFormat : uint8_t { bf16, fp8_ds_mla };

std::string_view mla_kv_format_name(MlaKVFormat format);  // "bf16", "fp8_ds_mla"
// Accepts "bf16"/"bfloat16" and "fp8_ds_mla"/"fp8"; throws specula::Error listing them otherwise.
MlaKVFormat parse_mla_kv_format(std::string_view name);

inline constexpr int kMlaFp8TileSize = 128;  // values per f32 scale in fp8_ds_mla rows

struct MLAKVPoolConfig {
  int64_t num_slots = 0;  // total slots, the reserved padding page included
  int num_layers = 0;
  int kv_lora_rank = 512;
  int qk_rope_head_dim = 64;
  MlaKVFormat format = MlaKVFormat::bf16;
  int index_head_dim = 0;  // 0: no indexer keys
  Device device = Device::cpu();
};

// Bytes of one slot's latent row in a format (656 for fp8_ds_mla at 512 + 64).
int64_t mla_row_bytes(MlaKVFormat format, int kv_lora_rank, int qk_rope_head_dim);
// Bytes of one slot's indexer key: index_head_dim fp8 values then one f32 scale.
int64_t mla_index_row_bytes(int index_head_dim);

// Host codecs of one row, shared by the pool, the CPU backend and the tests.
void encode_mla_row(MlaKVFormat format, const float* kv_c, const float* k_pe, int kv_lora_rank,
                    int qk_rope_head_dim, uint8_t* row);
// out: kv_lora_rank + qk_rope_head_dim f32 values.
void decode_mla_row(MlaKVFormat format, const uint8_t* row, int kv_lora_rank, int qk_rope_head_dim, float* out);
void encode_index_row(const float* k, int index_head_dim, uint8_t* row);
void decode_index_row(const uint8_t* row, int index_head_dim, float* out);

class MLAKVPool {
 public:
  explicit MLAKVPool(const MLAKVPoolConfig& config);

  const MLAKVPoolConfig& config() const { return config_; }
  int64_t num_slots() const { return config_.num_slots; }
  int num_layers() const { return config_.num_layers; }
  MlaKVFormat format() const { return config_.format; }
  int kv_lora_rank() const { return config_.kv_lora_rank; }
  int qk_rope_head_dim() const { return config_.qk_rope_head_dim; }
  int64_t row_bytes() const;        // one slot of one layer's latent buffer
  int64_t index_row_bytes() const;  // one slot of one layer's indexer buffer (0 without)

  TensorView kv_buffer(int layer_id) const;     // u8 [num_slots, row_bytes()]
  TensorView index_buffer(int layer_id) const;  // u8 [num_slots, index_row_bytes()]; an error without keys

  // Writes the new tokens' latent rows: kv_c [n, kv_lora_rank] and k_pe [n, qk_rope_head_dim]
  // (f32, bf16 or f16, contiguous rows) to slots loc[0..n), quantising for fp8_ds_mla.
  void set_mla_kv_buffer(int layer_id, std::span<const int32_t> loc, const TensorView& kv_c, const TensorView& k_pe);
  // The same on a CUDA pool: loc i32 [n] on the device; runs on cuda_stream, no sync.
  void set_mla_kv_buffer(int layer_id, const TensorView& loc, const TensorView& kv_c, const TensorView& k_pe,
                         void* cuda_stream);
  // Indexer keys k [n, index_head_dim] (f32, bf16 or f16) to slots loc.
  void set_index_k(int layer_id, std::span<const int32_t> loc, const TensorView& k);
  void set_index_k(int layer_id, const TensorView& loc, const TensorView& k, void* cuda_stream);

  // Dequantised f32 rows [slots.size(), kv_lora_rank + qk_rope_head_dim] (device pools copy the
  // rows back first, synchronously; meant for tests and references).
  void read_rows(int layer_id, std::span<const int32_t> slots, float* out) const;
  void read_index_rows(int layer_id, std::span<const int32_t> slots, float* out) const;

  // Copies every layer's rows (latent and indexer) from slot src[i] to dst[i], in order.
  void copy_slots(std::span<const int32_t> src, std::span<const int32_t> dst, void* cuda_stream = nullptr);

  size_t bytes_per_token() const;  // all layers, latent plus indexer

 private:
  void check_layer(int layer_id) const;

  MLAKVPoolConfig config_;
  std::vector<Buffer> kv_;
  std::vector<Buffer> index_;
  Buffer copy_tables_;  // device pools: buffer base pointers then row bytes (copy_slots)
  Buffer copy_moves_;   // device pools: copy_slots' source then destination slots
};

}  // namespace specula
