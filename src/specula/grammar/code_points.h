// Sets of code points as sorted inclusive ranges, shared by the grammar compiler and the regex
// translator.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace specula::grammar {

using CodePointRanges = std::vector<std::pair<uint32_t, uint32_t>>;
inline constexpr uint32_t kMaxCodePoint = 0x10FFFF;

// Sorted, disjoint and merged (touching ranges join).
inline CodePointRanges merge_ranges(CodePointRanges r) {
  std::sort(r.begin(), r.end());
  CodePointRanges out;
  for (const auto& x : r) {
    if (!out.empty() && x.first <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, x.second);
    } else {
      out.push_back(x);
    }
  }
  return out;
}

// Every code point in [0, kMaxCodePoint] that r does not hold.
inline CodePointRanges complement_ranges(const CodePointRanges& r) {
  CodePointRanges out;
  uint32_t next = 0;
  for (const auto& x : merge_ranges(r)) {
    if (x.first > next) out.emplace_back(next, x.first - 1);
    next = x.second + 1;
  }
  if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
  return out;
}

// The value of a hex digit (the caller checked std::isxdigit).
inline uint32_t hex_digit(char h) {
  return static_cast<uint32_t>(h >= '0' && h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
}

}  // namespace specula::grammar
