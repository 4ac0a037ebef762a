// What the runtime tests (CPU and GPU) share: the shipped model, a set of natural-text prompts
// whose greedy continuations have clear margins, and a greedy request.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

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

}  // namespace specula::testing_fixtures
