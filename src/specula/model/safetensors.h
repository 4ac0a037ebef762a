// Safetensors checkpoints, memory-mapped: one model.safetensors or shards listed by
// model.safetensors.index.json. Every header is validated (length, JSON, dtypes, shapes against
// byte ranges, ranges inside the file) so a corrupt or truncated file is a clear error naming
// the file and the tensor, never a crash.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "specula/core/tensor.h"
#include "specula/model/weights.h"

namespace specula {

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::filesystem::path& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // Views into the mapping (read-only data; valid while this object lives).
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }

 private:
  std::filesystem::path path_;
  void* mapping_ = nullptr;
  size_t size_ = 0;
  std::map<std::string, TensorView> tensors_;
  // Tensors whose bytes in the file are not aligned to their element size (an unpadded header)
  // are copied here, so every view can be read through a typed pointer.
  std::vector<Buffer> aligned_copies_;
};

class Checkpoint final : public WeightSource {
 public:
  // Opens model_dir/model.safetensors, or the shards named by model.safetensors.index.json.
  explicit Checkpoint(const std::filesystem::path& model_dir);

  bool contains(const std::string& name) const override { return tensors_.count(name) != 0; }
  // The tensor `name`; throws specula::Error if it is missing or its shape differs.
  TensorView get(const std::string& name, const Shape& expected_shape) const override;
  size_t total_bytes() const override;

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, TensorView> tensors_;
};

}  // namespace specula
