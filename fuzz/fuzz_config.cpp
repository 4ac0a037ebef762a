// Fuzzes specula::parse_model_config (config.json) on arbitrary bytes. A specula::Error is the
// expected answer to bad input; any other exception, sanitizer report or abort is a finding.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_common.h"
#include "specula/model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  specula::fuzz::guarded([&] {
    const specula::ModelConfig c = specula::parse_model_config(text);
    // Touch the results so a bad vector size or string would show.
    volatile size_t sink = c.layer_sliding_window.size() + c.eos_token_ids.size() + c.architecture.size();
    (void)sink;
  });
  return 0;
}
