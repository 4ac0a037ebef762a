// Regex: the Unicode-aware regular expressions of tokenizer.json pre-tokenizers (\p{L}, \p{N},
// lookahead), through PCRE2. Builds without PCRE2 refuse such patterns with a clear error.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace specula {

class Regex {
 public:
  explicit Regex(const std::string& pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Byte ranges [begin, end) of all non-overlapping matches, left to right.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace specula
