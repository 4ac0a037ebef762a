// Tiny checkpoints: the safetensors layout is an 8-byte little-endian header length, a JSON
// header naming each tensor's dtype, shape and byte range, then the data.
#include "tiny_checkpoint.h"

#include <fstream>

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

void write_tiny_checkpoint(const std::filesystem::path& dir, const nlohmann::json& config, const TinyWeights& weights) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << config.dump(2);
  nlohmann::json header;
  std::string data;
  for (const auto& [name, values] : weights.values) {
    const size_t begin = data.size();
    data.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
    header[name] = {{"dtype", "F32"}, {"shape", weights.shapes.at(name)}, {"data_offsets", {begin, data.size()}}};
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
