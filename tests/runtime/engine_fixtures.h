// What the runtime tests (CPU and GPU) share: the shipped model, a set of natural-text prompts
// whose greedy continuations have clear margins, and a greedy request.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "specula/runtime/engine.h"
#include "specula/runtime/request.h"

namespace specula::testing_fixtures {

inline const std::filesystem::path kModel = std::filesystem::path(SPECULA_SOURCE_DIR) / "models/specula-byte-6m";

inline const std::vector<std::string> kTexts = {
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time, in a small village by the sea, there lived",
    "In 1969, the first humans landed on the Moon and",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "The weather today is",
    "Numbers: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
    "She opened the door and saw",
    "A",
    "Machine learning is a field of study that gives computers the ability to learn without being explicitly "
    "programmed. It",
    "Roses are red, violets are blue,",
};

inline EngineRequest greedy(const std::string& text, int max_new = 24) {
  EngineRequest r;
  r.prompt = text;
  r.max_new_tokens = max_new;
  r.ignore_eos = true;
  return r;
}

// Submits a greedy request per text, runs the engine until idle and returns each output, checking
// that every request ran to its length.
inline std::vector<std::vector<int32_t>> run_greedy(Engine& engine, const std::vector<std::string>& texts, int max_new) {
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (const std::string& t : texts) handles.push_back(engine.submit(greedy(t, max_new)));
  engine.run_until_idle();
  std::vector<std::vector<int32_t>> outs;
  for (const auto& h : handles) {
    const RequestOutput out = h->wait();
    EXPECT_EQ(out.finish_reason, "length");
    outs.push_back(out.output_ids);
  }
  return outs;
}

}  // namespace specula::testing_fixtures
