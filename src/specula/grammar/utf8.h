// UTF-8 for the grammar engine: whole code points from text, and the code points a partial
// sequence can still become (a token may end inside a code point).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>

namespace specula::grammar {

// The code point at the start of s and its length in bytes; 0 when s does not start with a
// complete, well-formed sequence (overlong forms, surrogates and values past U+10FFFF refused).
inline size_t decode_utf8(std::string_view s, uint32_t& cp) {
  if (s.empty()) return 0;
  const auto b0 = static_cast<unsigned char>(s[0]);
  size_t n = 0;
  uint32_t min = 0;
  if (b0 < 0x80) {
    cp = b0;
    return 1;
  } else if ((b0 & 0xE0) == 0xC0) {
    n = 2, cp = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    n = 3, cp = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    n = 4, cp = b0 & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (s.size() < n) return 0;
  for (size_t i = 1; i < n; ++i) {
    const auto b = static_cast<unsigned char>(s[i]);
    if ((b & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

// The bytes a sequence that starts with lead byte b needs in all (0 for a byte no sequence starts with).
inline int utf8_length(unsigned char b) {
  if (b < 0x80) return 1;
  if ((b & 0xE0) == 0xC0) return b >= 0xC2 ? 2 : 0;
  if ((b & 0xF0) == 0xE0) return 3;
  if ((b & 0xF8) == 0xF0) return b <= 0xF4 ? 4 : 0;
  return 0;
}

// The code points a partial sequence (`len` of its `need` bytes) can still become: its bytes
// followed by the smallest and the largest continuation bytes, clipped to what a sequence of that
// length may encode (no overlong forms, nothing past U+10FFFF); lo > hi when it can become none.
inline std::pair<uint32_t, uint32_t> utf8_completions(const uint8_t* bytes, int len, int need) {
  uint32_t lo = bytes[0] & (need == 2 ? 0x1F : need == 3 ? 0x0F : 0x07), hi = lo;
  for (int i = 1; i < need; ++i) {
    const uint32_t b = i < len ? bytes[i] & 0x3F : 0;
    lo = (lo << 6) | b;
    hi = (hi << 6) | (i < len ? bytes[i] & 0x3F : 0x3F);
  }
  const uint32_t smallest = need == 2 ? 0x80 : need == 3 ? 0x800 : 0x10000;
  return {std::max(lo, smallest), std::min<uint32_t>(hi, 0x10FFFF)};
}

// Whether the completions [lo, hi] hold a code point that is not a UTF-16 surrogate (which UTF-8
// never encodes).
inline bool utf8_completable(std::pair<uint32_t, uint32_t> range) {
  return range.first <= range.second && (range.first <= 0xD7FF || range.second >= 0xE000);
}

}  // namespace specula::grammar
