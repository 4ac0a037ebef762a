// MLAKVPool implementation and the host row codecs. The codecs are the reference: the CUDA write
// kernels (kv/cuda/mla_set_kv_buffer.cu) reproduce their bytes exactly, so a cache written on
// either side reads the same.
#include "specula/kv/mla_kv_pool.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#ifdef SPECULA_HAS_CUDA
#include "specula/core/dtype_code.h"
#include "specula/core/cuda_check.h"
#include "specula/kv/cuda/copy_slots.h"
#include "specula/kv/cuda/mla_set_kv_buffer.h"
#endif

namespace specula {

#ifdef SPECULA_HAS_CUDA
static_assert(static_cast<int32_t>(MlaKVFormat::bf16) == cuda_kernels::kMlaRowBf16 &&
              static_cast<int32_t>(MlaKVFormat::fp8_ds_mla) == cuda_kernels::kMlaRowFp8DsMla);
static_assert(kMlaFp8TileSize == cuda_kernels::kMlaFp8Tile);
#endif

namespace {

// Index keys: a multiple of 16 keeps the f32 scale after them 4-byte aligned (rows are
// index_head_dim + 4 bytes) and the fp8 part a whole number of 16-byte vectors.
constexpr int kIndexHeadDimMultiple = 16;

void check_mla_layout(MlaKVFormat format, int kv_lora_rank, int qk_rope_head_dim) {
  SPECULA_CHECK(format == MlaKVFormat::bf16 || format == MlaKVFormat::fp8_ds_mla,
                "MLA KV format code {} is not known; known: bf16, fp8_ds_mla", static_cast<int>(format));
  SPECULA_CHECK(kv_lora_rank >= 1 && qk_rope_head_dim >= 1,
                "MLA row sizes must be positive: kv_lora_rank {}, qk_rope_head_dim {}", kv_lora_rank,
                qk_rope_head_dim);
  if (format == MlaKVFormat::fp8_ds_mla) {
    SPECULA_CHECK(kv_lora_rank % kMlaFp8TileSize == 0,
                  "fp8_ds_mla needs kv_lora_rank a multiple of {} (one f32 scale per tile); got {}",
                  kMlaFp8TileSize, kv_lora_rank);
    // Rows are kv_lora_rank + kv_lora_rank / 32 + 2 * qk_rope_head_dim bytes: an even RoPE dim
    // makes that a multiple of 4, so every row's f32 scales are aligned.
    SPECULA_CHECK(qk_rope_head_dim % 2 == 0, "fp8_ds_mla needs an even qk_rope_head_dim (aligned f32 scales); got {}",
                  qk_rope_head_dim);
  }
}

void check_index_head_dim(int index_head_dim, bool allow_zero) {
  SPECULA_CHECK((allow_zero && index_head_dim == 0) ||
                    (index_head_dim > 0 && index_head_dim % kIndexHeadDimMultiple == 0),
                "index_head_dim {} is not supported; allowed: {}a positive multiple of {}", index_head_dim,
                allow_zero ? "0 (no indexer keys) or " : "", kIndexHeadDimMultiple);
}

// One fp8 tile: scale = max|x| / 448 (1 when that is zero: an all-zero tile, or a max so small
// that the division underflows, where 0 / 0 would give NaN); stored = e4m3(clamp(x / scale)).
// The clamp matters only when a subnormal scale lost precision; it keeps outliers finite.
float quantise_tile(const float* x, int n, uint8_t* out) {
  float amax = 0.0f;
  // std::max(amax, NaN) keeps amax, as fmaxf does on the GPU.
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  float scale = amax / kFp8E4m3Max;
  if (scale == 0.0f) scale = 1.0f;
  for (int i = 0; i < n; ++i) out[i] = float_to_fp8_e4m3_bits(std::clamp(x[i] / scale, -kFp8E4m3Max, kFp8E4m3Max));
  return scale;
}

void dequantise_tile(const uint8_t* codes, int n, float scale, float* out) {
  for (int i = 0; i < n; ++i) out[i] = fp8_e4m3_bits_to_float(codes[i]) * scale;
}

void store_bf16(uint8_t* dst, float v) {
  const uint16_t bits = float_to_bf16_bits(v);
  std::memcpy(dst, &bits, sizeof(bits));
}

float load_bf16(const uint8_t* src) {
  uint16_t bits = 0;
  std::memcpy(&bits, src, sizeof(bits));
  return bf16_bits_to_float(bits);
}

void check_source(const TensorView& t, const Shape& shape, Device device, std::string_view what) {
  check_shape(t, shape, what);
  check_device(t, device, what);
  SPECULA_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::bf16 || t.dtype() == DType::f16,
                "{} dtype {} is not supported; supported: f32, bf16, f16", what, dtype_name(t.dtype()));
  SPECULA_CHECK(t.stride(1) == 1, "{} {} must have contiguous rows", what, t.str());
}

// Device slot indices: contiguous i32 on the pool's device. Returns how many.
int64_t check_device_loc(const TensorView& loc, Device device, std::string_view what) {
  const int64_t n = loc.numel();
  check_dtype(loc, DType::i32, what);
  check_shape(loc, {n}, what);
  check_device(loc, device, what);
  SPECULA_CHECK(loc.stride(0) == 1, "{} {} must be contiguous", what, loc.str());
  return n;
}

// Row i of a 2-D source as f32.
void source_row(const TensorView& t, size_t i, std::vector<float>& out) {
  const size_t elem = dtype_size(t.dtype());
  const char* row = static_cast<const char*>(t.data()) + static_cast<int64_t>(i) * t.stride(0) * static_cast<int64_t>(elem);
  out.resize(static_cast<size_t>(t.size(1)));
  convert_to_float(row, t.dtype(), out.data(), out.size());
}

void check_slots(std::span<const int32_t> slots, int64_t num_slots, std::string_view what) {
  for (size_t i = 0; i < slots.size(); ++i) {
    SPECULA_CHECK(slots[i] >= 0 && slots[i] < num_slots, "{}: slot {} (token {}) is out of range [0, {})", what,
                  slots[i], i, num_slots);
  }
}

// The rows at `slots` of a u8 [num_slots, row_bytes] buffer, gathered on the host (device pools:
// one synchronous copy per row).
std::vector<uint8_t> gather_rows(const Buffer& buffer, std::span<const int32_t> slots) {
  const auto row_bytes = static_cast<size_t>(buffer.shape()[1]);
  std::vector<uint8_t> rows(slots.size() * row_bytes);
  for (size_t i = 0; i < slots.size(); ++i) {
    const TensorView dst(rows.data() + i * row_bytes, DType::u8, Shape{1, static_cast<int64_t>(row_bytes)});
    copy(dst, buffer.view().slice(slots[i], 1));
  }
  return rows;
}

}  // namespace

std::string_view mla_kv_format_name(MlaKVFormat format) {
  switch (format) {
    case MlaKVFormat::bf16: return "bf16";
    case MlaKVFormat::fp8_ds_mla: return "fp8_ds_mla";
  }
  return "?";
}

MlaKVFormat parse_mla_kv_format(std::string_view name) {
  if (name == "bf16" || name == "bfloat16") return MlaKVFormat::bf16;
  if (name == "fp8_ds_mla" || name == "fp8") return MlaKVFormat::fp8_ds_mla;
  SPECULA_CHECK(false, "MLA KV format '{}' is not known; known: bf16, fp8_ds_mla (aliases: bfloat16, fp8)", name);
  return MlaKVFormat::bf16;
}

int64_t mla_row_bytes(MlaKVFormat format, int kv_lora_rank, int qk_rope_head_dim) {
  check_mla_layout(format, kv_lora_rank, qk_rope_head_dim);
  if (format == MlaKVFormat::bf16) return 2 * (static_cast<int64_t>(kv_lora_rank) + qk_rope_head_dim);
  return kv_lora_rank + 4 * (kv_lora_rank / kMlaFp8TileSize) + 2 * static_cast<int64_t>(qk_rope_head_dim);
}

int64_t mla_index_row_bytes(int index_head_dim) {
  check_index_head_dim(index_head_dim, /*allow_zero=*/true);
  return index_head_dim == 0 ? 0 : index_head_dim + static_cast<int64_t>(sizeof(float));
}

void encode_mla_row(MlaKVFormat format, const float* kv_c, const float* k_pe, int kv_lora_rank, int qk_rope_head_dim,
                    uint8_t* row) {
  check_mla_layout(format, kv_lora_rank, qk_rope_head_dim);
  if (format == MlaKVFormat::bf16) {
    for (int i = 0; i < kv_lora_rank; ++i) store_bf16(row + 2 * i, kv_c[i]);
    for (int i = 0; i < qk_rope_head_dim; ++i) store_bf16(row + 2 * (kv_lora_rank + i), k_pe[i]);
    return;
  }
  const int tiles = kv_lora_rank / kMlaFp8TileSize;
  for (int t = 0; t < tiles; ++t) {
    const float scale = quantise_tile(kv_c + t * kMlaFp8TileSize, kMlaFp8TileSize, row + t * kMlaFp8TileSize);
    std::memcpy(row + kv_lora_rank + 4 * t, &scale, sizeof(scale));
  }
  uint8_t* rope = row + kv_lora_rank + 4 * tiles;
  for (int i = 0; i < qk_rope_head_dim; ++i) store_bf16(rope + 2 * i, k_pe[i]);
}

void decode_mla_row(MlaKVFormat format, const uint8_t* row, int kv_lora_rank, int qk_rope_head_dim, float* out) {
  check_mla_layout(format, kv_lora_rank, qk_rope_head_dim);
  if (format == MlaKVFormat::bf16) {
    for (int i = 0; i < kv_lora_rank + qk_rope_head_dim; ++i) out[i] = load_bf16(row + 2 * i);
    return;
  }
  const int tiles = kv_lora_rank / kMlaFp8TileSize;
  for (int t = 0; t < tiles; ++t) {
    float scale = 0.0f;
    std::memcpy(&scale, row + kv_lora_rank + 4 * t, sizeof(scale));
    dequantise_tile(row + t * kMlaFp8TileSize, kMlaFp8TileSize, scale, out + t * kMlaFp8TileSize);
  }
  const uint8_t* rope = row + kv_lora_rank + 4 * tiles;
  for (int i = 0; i < qk_rope_head_dim; ++i) out[kv_lora_rank + i] = load_bf16(rope + 2 * i);
}

void encode_index_row(const float* k, int index_head_dim, uint8_t* row) {
  check_index_head_dim(index_head_dim, /*allow_zero=*/false);
  const float scale = quantise_tile(k, index_head_dim, row);
  std::memcpy(row + index_head_dim, &scale, sizeof(scale));
}

void decode_index_row(const uint8_t* row, int index_head_dim, float* out) {
  check_index_head_dim(index_head_dim, /*allow_zero=*/false);
  float scale = 0.0f;
  std::memcpy(&scale, row + index_head_dim, sizeof(scale));
  dequantise_tile(row, index_head_dim, scale, out);
}

MLAKVPool::MLAKVPool(const MLAKVPoolConfig& config) : config_(config) {
  SPECULA_CHECK(config_.num_slots >= 1 && config_.num_layers >= 1,
                "MLA KV pool sizes must be positive: num_slots {}, num_layers {}", config_.num_slots,
                config_.num_layers);
  SPECULA_CHECK(config_.num_slots <= INT32_MAX, "MLA KV pool of {} slots exceeds the 32-bit slot range",
                config_.num_slots);
  check_mla_layout(config_.format, config_.kv_lora_rank, config_.qk_rope_head_dim);
  check_index_head_dim(config_.index_head_dim, /*allow_zero=*/true);
  for (int l = 0; l < config_.num_layers; ++l) {
    kv_.emplace_back(DType::u8, Shape{config_.num_slots, row_bytes()}, config_.device);
    // Zeroed so the padding page and never-written slots decode to finite values (zero codes
    // times a zero scale in fp8 rows).
    kv_.back().zero();
    if (config_.index_head_dim > 0) {
      index_.emplace_back(DType::u8, Shape{config_.num_slots, index_row_bytes()}, config_.device);
      index_.back().zero();
    }
  }
}

int64_t MLAKVPool::row_bytes() const {
  return mla_row_bytes(config_.format, config_.kv_lora_rank, config_.qk_rope_head_dim);
}

int64_t MLAKVPool::index_row_bytes() const { return mla_index_row_bytes(config_.index_head_dim); }

void MLAKVPool::check_layer(int layer_id) const {
  SPECULA_CHECK(layer_id >= 0 && layer_id < config_.num_layers, "layer_id {} is out of range [0, {})", layer_id,
                config_.num_layers);
}

TensorView MLAKVPool::kv_buffer(int layer_id) const {
  check_layer(layer_id);
  return kv_[static_cast<size_t>(layer_id)].view();
}

TensorView MLAKVPool::index_buffer(int layer_id) const {
  check_layer(layer_id);
  SPECULA_CHECK(config_.index_head_dim > 0, "this MLA KV pool keeps no indexer keys (index_head_dim 0)");
  return index_[static_cast<size_t>(layer_id)].view();
}

size_t MLAKVPool::bytes_per_token() const {
  return static_cast<size_t>(config_.num_layers) * static_cast<size_t>(row_bytes() + index_row_bytes());
}

void MLAKVPool::set_mla_kv_buffer(int layer_id, std::span<const int32_t> loc, const TensorView& kv_c,
                                  const TensorView& k_pe) {
  check_layer(layer_id);
  SPECULA_CHECK(config_.device.is_cpu(), "set_mla_kv_buffer with host slots needs a CPU pool; the pool is on {} "
                "(pass loc as a device tensor)", config_.device.str());
  const auto n = static_cast<int64_t>(loc.size());
  check_source(kv_c, {n, config_.kv_lora_rank}, Device::cpu(), "set_mla_kv_buffer kv_c");
  check_source(k_pe, {n, config_.qk_rope_head_dim}, Device::cpu(), "set_mla_kv_buffer k_pe");
  check_slots(loc, config_.num_slots, "set_mla_kv_buffer");
  const TensorView cache = kv_buffer(layer_id);
  const int64_t bytes = row_bytes();
  std::vector<float> c, pe;
  for (size_t i = 0; i < loc.size(); ++i) {
    source_row(kv_c, i, c);
    source_row(k_pe, i, pe);
    encode_mla_row(config_.format, c.data(), pe.data(), config_.kv_lora_rank, config_.qk_rope_head_dim,
                   cache.data_as<uint8_t>() + loc[i] * bytes);
  }
}

void MLAKVPool::set_mla_kv_buffer(int layer_id, const TensorView& loc, const TensorView& kv_c, const TensorView& k_pe,
                                  void* cuda_stream) {
  check_layer(layer_id);
  SPECULA_CHECK(config_.device.is_cuda(), "this set_mla_kv_buffer is for CUDA pools; the pool is on {}",
                config_.device.str());
  const int64_t n = check_device_loc(loc, config_.device, "set_mla_kv_buffer loc");
  check_source(kv_c, {n, config_.kv_lora_rank}, config_.device, "set_mla_kv_buffer kv_c");
  check_source(k_pe, {n, config_.qk_rope_head_dim}, config_.device, "set_mla_kv_buffer k_pe");
#ifdef SPECULA_HAS_CUDA
  cuda_kernels::MlaSetKVParams p{};
  p.kv_c = kv_c.data();
  p.kv_c_stride = kv_c.stride(0);
  p.kv_c_dtype = kernel_dtype_code(kv_c.dtype());
  p.k_pe = k_pe.data();
  p.k_pe_stride = k_pe.stride(0);
  p.k_pe_dtype = kernel_dtype_code(k_pe.dtype());
  p.loc = loc.data_as<const int32_t>();
  p.num_tokens = n;
  p.cache = kv_buffer(layer_id).data();
  p.row_bytes = row_bytes();
  p.kv_lora_rank = config_.kv_lora_rank;
  p.qk_rope_head_dim = config_.qk_rope_head_dim;
  p.format = static_cast<int32_t>(config_.format);
  cuda_kernels::launch_mla_set_kv_buffer(p, static_cast<cudaStream_t>(cuda_stream));
#else
  (void)cuda_stream;
#endif
}

void MLAKVPool::set_index_k(int layer_id, std::span<const int32_t> loc, const TensorView& k) {
  check_layer(layer_id);
  SPECULA_CHECK(config_.index_head_dim > 0, "set_index_k: this MLA KV pool keeps no indexer keys (index_head_dim 0)");
  SPECULA_CHECK(config_.device.is_cpu(), "set_index_k with host slots needs a CPU pool; the pool is on {} (pass loc "
                "as a device tensor)", config_.device.str());
  const auto n = static_cast<int64_t>(loc.size());
  check_source(k, {n, config_.index_head_dim}, Device::cpu(), "set_index_k k");
  check_slots(loc, config_.num_slots, "set_index_k");
  const TensorView cache = index_buffer(layer_id);
  const int64_t bytes = index_row_bytes();
  std::vector<float> key;
  for (size_t i = 0; i < loc.size(); ++i) {
    source_row(k, i, key);
    encode_index_row(key.data(), config_.index_head_dim, cache.data_as<uint8_t>() + loc[i] * bytes);
  }
}

void MLAKVPool::set_index_k(int layer_id, const TensorView& loc, const TensorView& k, void* cuda_stream) {
  check_layer(layer_id);
  SPECULA_CHECK(config_.index_head_dim > 0, "set_index_k: this MLA KV pool keeps no indexer keys (index_head_dim 0)");
  SPECULA_CHECK(config_.device.is_cuda(), "this set_index_k is for CUDA pools; the pool is on {}", config_.device.str());
  const int64_t n = check_device_loc(loc, config_.device, "set_index_k loc");
  check_source(k, {n, config_.index_head_dim}, config_.device, "set_index_k k");
#ifdef SPECULA_HAS_CUDA
  cuda_kernels::MlaSetIndexKParams p{};
  p.k = k.data();
  p.k_stride = k.stride(0);
  p.k_dtype = kernel_dtype_code(k.dtype());
  p.loc = loc.data_as<const int32_t>();
  p.num_tokens = n;
  p.cache = index_buffer(layer_id).data();
  p.index_head_dim = config_.index_head_dim;
  cuda_kernels::launch_mla_set_index_k(p, static_cast<cudaStream_t>(cuda_stream));
#else
  (void)cuda_stream;
#endif
}

void MLAKVPool::read_rows(int layer_id, std::span<const int32_t> slots, float* out) const {
  check_layer(layer_id);
  check_slots(slots, config_.num_slots, "read_rows");
  const std::vector<uint8_t> rows = gather_rows(kv_[static_cast<size_t>(layer_id)], slots);
  const auto bytes = static_cast<size_t>(row_bytes());
  const size_t width = static_cast<size_t>(config_.kv_lora_rank) + static_cast<size_t>(config_.qk_rope_head_dim);
  for (size_t i = 0; i < slots.size(); ++i) {
    decode_mla_row(config_.format, rows.data() + i * bytes, config_.kv_lora_rank, config_.qk_rope_head_dim,
                   out + i * width);
  }
}

void MLAKVPool::read_index_rows(int layer_id, std::span<const int32_t> slots, float* out) const {
  check_layer(layer_id);
  SPECULA_CHECK(config_.index_head_dim > 0, "read_index_rows: this MLA KV pool keeps no indexer keys (index_head_dim 0)");
  check_slots(slots, config_.num_slots, "read_index_rows");
  const std::vector<uint8_t> rows = gather_rows(index_[static_cast<size_t>(layer_id)], slots);
  const auto bytes = static_cast<size_t>(index_row_bytes());
  const auto width = static_cast<size_t>(config_.index_head_dim);
  for (size_t i = 0; i < slots.size(); ++i) {
    decode_index_row(rows.data() + i * bytes, config_.index_head_dim, out + i * width);
  }
}

void MLAKVPool::copy_slots(std::span<const int32_t> src, std::span<const int32_t> dst, void* cuda_stream) {
  SPECULA_CHECK(src.size() == dst.size(), "copy_slots: {} sources but {} destinations", src.size(), dst.size());
  for (size_t i = 0; i < src.size(); ++i) {
    SPECULA_CHECK(src[i] >= 0 && src[i] < config_.num_slots && dst[i] >= 0 && dst[i] < config_.num_slots,
                  "copy_slots: slot {} -> {} (move {}) is outside [0, {})", src[i], dst[i], i, config_.num_slots);
  }
  if (src.empty()) return;
  // Latent buffers of every layer, then indexer buffers (none when index_head_dim is 0).
  std::vector<const Buffer*> buffers;
  for (const Buffer& b : kv_) buffers.push_back(&b);
  for (const Buffer& b : index_) buffers.push_back(&b);
  if (config_.device.is_cpu()) {
    for (size_t i = 0; i < src.size(); ++i) {
      if (src[i] == dst[i]) continue;
      for (const Buffer* b : buffers) {
        const auto bytes = static_cast<size_t>(b->shape()[1]);
        std::memcpy(b->data_as<uint8_t>() + static_cast<size_t>(dst[i]) * bytes,
                    b->data_as<const uint8_t>() + static_cast<size_t>(src[i]) * bytes, bytes);
      }
    }
    return;
  }
#ifdef SPECULA_HAS_CUDA
  const auto stream = static_cast<cudaStream_t>(cuda_stream);
  const auto num_buffers = static_cast<int64_t>(buffers.size());
  if (copy_tables_.data() == nullptr) {
    // Every buffer's base pointer, then every row size; uploaded once (the buffers never move).
    std::vector<int64_t> table;
    for (const Buffer* b : buffers) table.push_back(reinterpret_cast<int64_t>(b->data()));
    for (const Buffer* b : buffers) table.push_back(b->shape()[1]);
    copy_tables_ = Buffer(DType::i64, {static_cast<int64_t>(table.size())}, config_.device);
    CUDA_CHECK(cudaMemcpy(copy_tables_.data(), table.data(), table.size() * sizeof(int64_t), cudaMemcpyHostToDevice));
  }
  std::vector<int32_t> moves(src.begin(), src.end());  // sources then destinations
  moves.insert(moves.end(), dst.begin(), dst.end());
  const auto n = static_cast<int64_t>(src.size());
  if (copy_moves_.data() == nullptr || copy_moves_.numel() < 2 * n) copy_moves_ = Buffer(DType::i32, {2 * n}, config_.device);
  CUDA_CHECK(cudaMemcpyAsync(copy_moves_.data(), moves.data(), moves.size() * sizeof(int32_t), cudaMemcpyHostToDevice,
                             stream));
  cuda_kernels::CopySlotsParams p{};
  p.buffers = reinterpret_cast<void* const*>(copy_tables_.data());
  p.row_bytes = copy_tables_.data_as<const int64_t>() + num_buffers;
  p.num_buffers = static_cast<int32_t>(num_buffers);
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
