// Fuzzes the safetensors reader. The first input byte picks what the rest is:
//  - even: a whole .safetensors file, opened with specula::SafetensorsFile (through a memfd,
//    as /proc/self/fd/N); every returned TensorView's bytes are read, so a view reaching outside
//    the mapping is caught by ASan (or as SIGSEGV past the mapping's end);
//  - odd: a model.safetensors.index.json, opened with specula::Checkpoint in a per-process temp
//    folder that also holds three small valid shards the index may name (model-0000{1,2,3}-of-
//    00003.safetensors; shards 1 and 3 both hold "shared", so naming both is a duplicate).
// A specula::Error is the expected answer to bad input; anything else is a finding.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "fuzz_common.h"
#include "specula/model/safetensors.h"

namespace {

namespace fs = std::filesystem;

uint64_t sum_bytes(const specula::TensorView& v) {
  const auto* p = static_cast<const uint8_t*>(v.data());
  uint64_t sum = 0;
  for (size_t i = 0; i < v.nbytes(); ++i) sum += p[i];
  return sum;
}

void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// An 8-byte little-endian header length, the JSON header, then the data.
std::string safetensors(const std::string& header, const std::string& data) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xFF);
  return s + header + data;
}

struct Scratch {
  int memfd = -1;
  std::string memfd_path;
  fs::path dir;

  Scratch() {
    memfd = ::memfd_create("fuzz_safetensors", 0);
    if (memfd < 0) std::abort();
    memfd_path = "/proc/self/fd/" + std::to_string(memfd);
    std::string tmpl = (fs::temp_directory_path() / "specula-fuzz-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) std::abort();
    dir = tmpl;
    write_file(dir / "model-00001-of-00003.safetensors",
               safetensors(R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
                           R"("shared":{"dtype":"U8","shape":[1],"data_offsets":[16,17]}})",
                           std::string(17, '\x01')));
    write_file(dir / "model-00002-of-00003.safetensors",
               safetensors(R"({"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[3],"data_offsets":[0,6]}})",
                           std::string(6, '\x02')));
    write_file(dir / "model-00003-of-00003.safetensors",
               safetensors(R"({"shared":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", std::string(1, '\x03')));
  }
  ~Scratch() {
    std::error_code ignored;
    fs::remove_all(dir, ignored);
  }
};

Scratch& scratch() {
  static Scratch s;
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  Scratch& s = scratch();
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  volatile uint64_t sink = 0;
  if ((data[0] & 1) == 0) {
    if (::ftruncate(s.memfd, 0) != 0 || ::pwrite(s.memfd, rest.data(), rest.size(), 0) != static_cast<ssize_t>(rest.size())) {
      std::abort();
    }
    specula::fuzz::guarded([&] {
      const specula::SafetensorsFile file(s.memfd_path);
      for (const auto& [name, view] : file.tensors()) sink = sink + name.size() + sum_bytes(view);
    });
  } else {
    write_file(s.dir / "model.safetensors.index.json", rest);
    specula::fuzz::guarded([&] {
      const specula::Checkpoint checkpoint(s.dir);
      sink = sink + checkpoint.total_bytes();
      if (checkpoint.contains("a")) sink = sink + sum_bytes(checkpoint.get("a", specula::Shape{2, 2}));
      if (checkpoint.contains("b")) sink = sink + sum_bytes(checkpoint.get("b", specula::Shape{3}));
    });
  }
  return 0;
}
