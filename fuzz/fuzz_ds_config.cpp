// Fuzzes specula::parse_double_sparsity_config (a double-sparsity channel file) on arbitrary
// bytes, for a model of 2 layers x 2 KV heads of head_dim 16 and each channel type. A
// specula::Error is the expected answer to bad input; anything else is a finding.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_common.h"
#include "specula/attention/double_sparsity/ds_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (const char* type : {"q", "k", "qk"}) {
    specula::fuzz::guarded([&] {
      const specula::DoubleSparsityConfig c =
          specula::parse_double_sparsity_config(text, "channels.json", 2, 2, 16, 4, 64, 128, type);
      // Every channel kept must index a head dimension.
      for (const auto& layer : c.channels) {
        for (int32_t ch : layer) {
          if (ch < 0 || ch >= 16) __builtin_trap();
        }
      }
    });
  }
  return 0;
}
