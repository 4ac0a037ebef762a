// Tiny checkpoints: the safetensors layout is an 8-byte little-endian header length, a JSON
// header naming each tensor's dtype, shape and byte range, then the data.
#include "tiny_checkpoint.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <fstream>

#include "specula/core/dtype.h"

namespace specula::test {

void TinyWeights::add(std::mt19937& rng, const std::string& name, std::vector<int64_t> dims, float scale, float mean) {
  std::normal_distribution<float> dist(mean, scale);
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  values[name] = std::move(v);
  shapes[name] = std::move(dims);
}

// Round to nearest even at bf16's 8 significant bits.
float round_bf16(float v) {
  if (std::isnan(v)) return v;
  const uint32_t u = std::bit_cast<uint32_t>(v);
  return std::bit_cast<float>((u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u);
}

double decode_e4m3(uint8_t code) {
  const int sign = code >> 7, exponent = (code >> 3) & 0xf, mantissa = code & 7;
  if (exponent == 0xf && mantissa == 7) return NAN;
  const double magnitude = exponent == 0 ? std::ldexp(mantissa / 8.0, -6) : std::ldexp(1.0 + mantissa / 8.0, exponent - 7);
  return sign != 0 ? -magnitude : magnitude;
}

void quantize_fp8_blocks(TinyWeights& w, const std::string& name, int block_out, int block_in) {
  const std::vector<int64_t>& shape = w.shapes.at(name);
  std::vector<float>& v = w.values.at(name);
  const int64_t rows = shape.at(0), cols = shape.at(1);
  const int64_t block_rows = (rows + block_out - 1) / block_out, block_cols = (cols + block_in - 1) / block_in;
  std::vector<float> scales(static_cast<size_t>(block_rows * block_cols));
  std::vector<uint8_t> codes(v.size());
  for (int64_t br = 0; br < block_rows; ++br) {
    for (int64_t bc = 0; bc < block_cols; ++bc) {
      float top = 0;
      for (int64_t r = br * block_out; r < std::min(rows, (br + 1) * block_out); ++r) {
        for (int64_t c = bc * block_in; c < std::min(cols, (bc + 1) * block_in); ++c) top = std::max(top, std::fabs(v[static_cast<size_t>(r * cols + c)]));
      }
      const float scale = top > 0 ? top / 448.0f : 1.0f;
      scales[static_cast<size_t>(br * block_cols + bc)] = scale;
      for (int64_t r = br * block_out; r < std::min(rows, (br + 1) * block_out); ++r) {
        for (int64_t c = bc * block_in; c < std::min(cols, (bc + 1) * block_in); ++c) {
          float& x = v[static_cast<size_t>(r * cols + c)];
          const uint8_t code = float_to_fp8_e4m3_bits(x / scale);
          codes[static_cast<size_t>(r * cols + c)] = code;
          x = round_bf16(static_cast<float>(decode_e4m3(code) * scale));
        }
      }
    }
  }
  w.fp8_codes[name] = std::move(codes);
  w.values[name + "_scale_inv"] = std::move(scales);
  w.shapes[name + "_scale_inv"] = {block_rows, block_cols};
}

void write_tiny_checkpoint(const std::filesystem::path& dir, const nlohmann::json& config, const TinyWeights& weights) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << config.dump(2);
  nlohmann::json header;
  std::string data;
  // f32 tensors first, fp8 codes after them: every f32 tensor stays 4-byte aligned and the data
  // has no holes (safetensors forbids them).
  for (const bool fp8 : {false, true}) {
    for (const auto& [name, values] : weights.values) {
      const auto codes = weights.fp8_codes.find(name);
      if ((codes != weights.fp8_codes.end()) != fp8) continue;
      const size_t begin = data.size();
      if (fp8) {
        data.append(reinterpret_cast<const char*>(codes->second.data()), codes->second.size());
      } else {
        data.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
      }
      header[name] = {{"dtype", fp8 ? "F8_E4M3" : "F32"}, {"shape", weights.shapes.at(name)}, {"data_offsets", {begin, data.size()}}};
    }
  }
  std::string h = header.dump();
  while (h.size() % 8 != 0) h += ' ';
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i) file[static_cast<size_t>(i)] = static_cast<char>((h.size() >> (8 * i)) & 0xff);
  file += h + data;
  std::ofstream(dir / "model.safetensors", std::ios::binary) << file;
  std::filesystem::copy_file(std::filesystem::path(SPECULA_SOURCE_DIR) / "models/specula-byte-6m/tokenizer.json",
                             dir / "tokenizer.json", std::filesystem::copy_options::overwrite_existing);
}

}  // namespace specula::test
