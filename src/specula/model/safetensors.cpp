// Safetensors parsing: 8-byte little-endian header length, a JSON header of
// {name: {dtype, shape, data_offsets}}, then the data. Mapped read-only with mmap.
#include "specula/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <tuple>

#include "specula/core/error.h"
#include "specula/core/json_reader.h"

namespace specula {

namespace {

using json = nlohmann::json;

DType safetensors_dtype(const std::string& name, const std::string& file, const std::string& tensor) {
  if (name == "F32") return DType::f32;
  if (name == "F16") return DType::f16;
  if (name == "BF16") return DType::bf16;
  if (name == "F8_E4M3") return DType::fp8_e4m3;
  if (name == "F8_E5M2") return DType::fp8_e5m2;
  if (name == "I32") return DType::i32;
  if (name == "I64") return DType::i64;
  if (name == "U8" || name == "BOOL") return DType::u8;
  SPECULA_CHECK(false, "{}: tensor '{}' has dtype {}, which specula does not read (supported: F32, F16, BF16, "
                "F8_E4M3, F8_E5M2, I32, I64, U8, BOOL)", file, tensor, name);
  return DType::f32;
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::filesystem::path& path) : path_(path) {
  const std::string file = path.string();
  const int fd = ::open(file.c_str(), O_RDONLY);
  SPECULA_CHECK(fd >= 0, "cannot open {}: {}", file, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    SPECULA_CHECK(false, "cannot stat {}", file);
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ < 8) {
    ::close(fd);
    SPECULA_CHECK(false, "{} is {} bytes: too short to be a safetensors file", file, size_);
  }
  mapping_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  SPECULA_CHECK(mapping_ != MAP_FAILED, "cannot map {}: {}", file, std::strerror(errno));
  try {
    const auto* bytes = static_cast<const uint8_t*>(mapping_);
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
    SPECULA_CHECK(header_len <= size_ - 8, "{}: header length {} exceeds the file size {} (truncated or not "
                  "safetensors)", file, header_len, size_);
    const json header = JsonReader::parse(std::string_view(reinterpret_cast<const char*>(bytes + 8), header_len), file);
    SPECULA_CHECK(header.is_object(), "{}: the header is not a JSON object", file);
    const size_t data_start = 8 + header_len;
    const size_t data_size = size_ - data_start;
    // Byte ranges, to refuse two tensors that share bytes (a corrupt or crafted header).
    std::vector<std::tuple<uint64_t, uint64_t, std::string>> ranges;
    JsonReader(header, file).for_each_member([&](const std::string& name, const JsonReader& info) {
      if (name == "__metadata__") return;
      if (!info.is_object()) info.fail("must be an object of dtype, shape and data_offsets");
      const DType dtype = safetensors_dtype(info.at("dtype").string(), file, name);
      std::vector<int64_t> dims;
      uint64_t elements = 1;
      const JsonReader shape_json = info.at("shape");
      for (size_t i = 0; i < shape_json.size(); ++i) {
        // Bounded by the file at every step, so a crafted shape cannot overflow the byte count.
        const auto dim = static_cast<uint64_t>(shape_json[i].integer(0, INT64_MAX));
        SPECULA_CHECK(dim == 0 || elements <= data_size / dim, "{}: tensor '{}' has a shape larger than the file", file,
                      name);
        elements *= dim;
        dims.push_back(static_cast<int64_t>(dim));
      }
      const JsonReader off = info.at("data_offsets");
      if (!off.is_array() || off.size() != 2) off.fail("must be [begin, end]");
      const auto begin = static_cast<uint64_t>(off[0].integer(0, INT64_MAX));
      const auto end = static_cast<uint64_t>(off[1].integer(0, INT64_MAX));
      const Shape shape(std::span<const int64_t>(dims.data(), dims.size()));
      const uint64_t expected = static_cast<uint64_t>(shape.numel()) * dtype_size(dtype);
      SPECULA_CHECK(begin <= end && end <= data_size, "{}: tensor '{}' spans bytes [{}, {}) but the data section has {} "
                    "(truncated file?)", file, name, begin, end, data_size);
      SPECULA_CHECK(end - begin == expected, "{}: tensor '{}' of shape {} {} needs {} bytes, its range holds {}", file,
                    name, shape.str(), dtype_name(dtype), expected, end - begin);
      if (begin < end) ranges.emplace_back(begin, end, name);
      const uint8_t* data = bytes + data_start + begin;
      if (reinterpret_cast<uintptr_t>(data) % dtype_size(dtype) != 0) {
        aligned_copies_.emplace_back(dtype, shape);
        std::memcpy(aligned_copies_.back().data(), data, expected);
        tensors_.emplace(name, aligned_copies_.back().view());
      } else {
        tensors_.emplace(name, TensorView(const_cast<uint8_t*>(data), dtype, shape));
      }
    });
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i) {
      const auto& [b0, e0, n0] = ranges[i - 1];
      const auto& [b1, e1, n1] = ranges[i];
      SPECULA_CHECK(b1 >= e0, "{}: tensors '{}' [{}, {}) and '{}' [{}, {}) overlap", file, n0, b0, e0, n1, b1, e1);
    }
  } catch (...) {
    ::munmap(mapping_, size_);
    mapping_ = nullptr;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, size_);
}

Checkpoint::Checkpoint(const std::filesystem::path& model_dir) {
  const auto single = model_dir / "model.safetensors";
  const auto index = model_dir / "model.safetensors.index.json";
  std::vector<std::filesystem::path> shards;
  if (std::filesystem::exists(index)) {
    const json j = JsonReader::parse_file(index);
    const JsonReader weight_map = JsonReader(j, index.string()).at("weight_map");
    std::vector<std::string> names;
    weight_map.for_each_member([&](const std::string& /*tensor*/, const JsonReader& shard) {
      std::string name = shard.string();
      // Shards sit beside the index: a name with a folder in it is not a shard of this model.
      SPECULA_CHECK(!name.empty() && name.find('/') == std::string::npos && name != "." && name != "..",
                    "{}: shard name '{}' is not a file name in the model folder", index.string(), name);
      names.push_back(std::move(name));
    });
    std::sort(names.begin(), names.end());
    names.erase(std::unique(names.begin(), names.end()), names.end());
    for (const auto& n : names) shards.push_back(model_dir / n);
  } else {
    SPECULA_CHECK(std::filesystem::exists(single), "{} holds neither model.safetensors nor model.safetensors.index.json",
                  model_dir.string());
    shards.push_back(single);
  }
  for (const auto& shard : shards) {
    files_.push_back(std::make_unique<SafetensorsFile>(shard));
    for (const auto& [name, view] : files_.back()->tensors()) {
      SPECULA_CHECK(tensors_.emplace(name, view).second, "tensor '{}' appears in two shards", name);
    }
  }
}

TensorView Checkpoint::get(const std::string& name, const Shape& expected_shape) const {
  const auto it = tensors_.find(name);
  SPECULA_CHECK(it != tensors_.end(), "the checkpoint has no tensor '{}'", name);
  SPECULA_CHECK(it->second.shape() == expected_shape, "tensor '{}' has shape {}; the config needs {}", name,
                it->second.shape().str(), expected_shape.str());
  return it->second;
}

size_t Checkpoint::total_bytes() const {
  size_t total = 0;
  for (const auto& [name, view] : tensors_) total += view.nbytes();
  return total;
}


}  // namespace specula
