// UTF-8 encoding, and decoding by the table of well-formed byte sequences (Unicode Table 3-7).
#include "specula/model/utf8.h"

#include <cstdint>
#include <cstdlib>

#include "specula/core/error.h"

#ifdef SPECULA_HAS_UTF8PROC
#include <utf8proc.h>
#endif

namespace specula {

namespace {

// For a lead byte: the sequence length (0: never valid as a lead) and the range allowed for the
// second byte (later bytes are always 80..BF).
struct Lead {
  int length;
  uint8_t lo, hi;
};

Lead lead_of(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};  // no surrogates
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

// How many bytes at `i` form a valid prefix of a sequence (1..length); `complete` when all.
size_t valid_prefix(std::string_view s, size_t i, bool& complete) {
  const Lead lead = lead_of(static_cast<uint8_t>(s[i]));
  complete = false;
  if (lead.length == 0) return 0;
  if (lead.length == 1) {
    complete = true;
    return 1;
  }
  size_t n = 1;
  for (int k = 1; k < lead.length; ++k) {
    if (i + n >= s.size()) return n;  // ran out: valid so far
    const auto b = static_cast<uint8_t>(s[i + n]);
    const uint8_t lo = k == 1 ? lead.lo : 0x80, hi = k == 1 ? lead.hi : 0xBF;
    if (b < lo || b > hi) return n;  // invalid here: the subpart ends before this byte
    ++n;
  }
  complete = true;
  return n;
}

}  // namespace

std::string utf8_encode(uint32_t cp) {
  SPECULA_ASSERT(cp <= 0x10FFFF);
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

size_t utf8_sequence_length(uint8_t lead) {
  if ((lead >> 5) == 0x6) return 2;
  if ((lead >> 4) == 0xE) return 3;
  if ((lead >> 3) == 0x1E) return 4;
  return 1;
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    bool complete = false;
    const size_t n = valid_prefix(s, i, complete);
    if (complete) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      i += n == 0 ? 1 : n;
    }
  }
  return out;
}

size_t utf8_final_prefix(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    bool complete = false;
    const size_t n = valid_prefix(s, i, complete);
    if (!complete && n > 0 && i + n == s.size()) return i;  // an incomplete tail: wait for more
    i += n == 0 ? 1 : n;
  }
  return s.size();
}

std::string utf8_nfc(std::string_view text) {
#ifdef SPECULA_HAS_UTF8PROC
  utf8proc_uint8_t* result = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                          static_cast<utf8proc_ssize_t>(text.size()), &result,
                                          static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) {
    // Not valid UTF-8: normalise the lossy decoding instead, as a tokenizer fed raw bytes would.
    return utf8_nfc(utf8_lossy(text));
  }
  std::string out(reinterpret_cast<char*>(result), static_cast<size_t>(n));
  std::free(result);
  return out;
#else
  (void)text;
  SPECULA_CHECK(false, "this tokenizer needs Unicode NFC normalisation, which needs utf8proc (install libutf8proc-dev "
                "and rebuild)");
  return {};
#endif
}

}  // namespace specula
