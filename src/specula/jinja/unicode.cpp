// UTF-8 decoding and the few Unicode properties Python's str methods depend on.
#include "specula/jinja/unicode.h"

#ifdef SPECULA_HAS_UTF8PROC
#include <utf8proc.h>
#endif

namespace specula::jinja::unicode {

char32_t decode(std::string_view text, size_t& pos) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(pos);
  int length = 0;
  char32_t cp = 0;
  if (lead < 0x80) {
    ++pos;
    return lead;
  } else if ((lead & 0xE0) == 0xC0) {
    length = 2;
    cp = lead & 0x1F;
  } else if ((lead & 0xF0) == 0xE0) {
    length = 3;
    cp = lead & 0x0F;
  } else if ((lead & 0xF8) == 0xF0) {
    length = 4;
    cp = lead & 0x07;
  } else {
    ++pos;
    return lead;  // stray continuation or invalid lead byte: one byte, passed through
  }
  if (pos + length > text.size()) {
    ++pos;
    return lead;
  }
  for (int i = 1; i < length; ++i) {
    const unsigned char c = byte(pos + i);
    if ((c & 0xC0) != 0x80) {
      ++pos;
      return lead;
    }
    cp = (cp << 6) | (c & 0x3F);
  }
  pos += length;
  return cp;
}

void encode(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool is_ascii(std::string_view text) {
  for (char c : text) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

std::vector<size_t> code_point_offsets(std::string_view text) {
  std::vector<size_t> offsets;
  offsets.reserve(text.size() + 1);
  size_t pos = 0;
  while (pos < text.size()) {
    offsets.push_back(pos);
    decode(text, pos);
  }
  offsets.push_back(text.size());
  return offsets;
}

size_t code_point_count(std::string_view text) {
  size_t count = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    decode(text, pos);
    ++count;
  }
  return count;
}

bool is_space(char32_t cp) {
  switch (cp) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x1C: case 0x1D: case 0x1E:
    case 0x1F: case 0x20: case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029:
    case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

namespace {
bool in_set(char32_t cp, const std::string_view* chars) {
  if (chars == nullptr) return is_space(cp);
  size_t pos = 0;
  while (pos < chars->size()) {
    if (decode(*chars, pos) == cp) return true;
  }
  return false;
}
}  // namespace

std::string_view strip(std::string_view text, bool left, bool right, const std::string_view* chars) {
  size_t begin = 0;
  size_t end = text.size();
  if (left) {
    while (begin < end) {
      size_t next = begin;
      if (!in_set(decode(text, next), chars)) break;
      begin = next;
    }
  }
  if (right) {
    while (end > begin) {
      // Step back to the start of the last code point (continuation bytes are 10xxxxxx).
      size_t start = end - 1;
      while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
      size_t probe = start;
      const char32_t cp = decode(text, probe);
      if (probe != end || !in_set(cp, chars)) break;
      end = start;
    }
  }
  return text.substr(begin, end - begin);
}

char32_t to_upper(char32_t cp) {
#ifdef SPECULA_HAS_UTF8PROC
  return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(cp)));
#else
  return (cp >= 'a' && cp <= 'z') ? cp - 32 : cp;
#endif
}

char32_t to_lower(char32_t cp) {
#ifdef SPECULA_HAS_UTF8PROC
  return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp)));
#else
  return (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp;
#endif
}

bool is_alpha(char32_t cp) {
#ifdef SPECULA_HAS_UTF8PROC
  const auto category = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return category >= UTF8PROC_CATEGORY_LU && category <= UTF8PROC_CATEGORY_LO;
#else
  return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp >= 0x80;
#endif
}

namespace {
template <typename Map>
std::string map_case(std::string_view text, Map map) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) encode(map(decode(text, pos)), out);
  return out;
}
}  // namespace

std::string upper(std::string_view text) { return map_case(text, to_upper); }
std::string lower(std::string_view text) { return map_case(text, to_lower); }

bool is_printable(char32_t cp) {
  if (cp < 0x20 || (cp >= 0x7F && cp <= 0xA0) || cp == 0xAD) return false;
  if (cp < 0x7F) return true;
#ifdef SPECULA_HAS_UTF8PROC
  // Python: printable unless the category is Other (C*) or Separator (Z*) other than ' '.
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS: case UTF8PROC_CATEGORY_CO: case UTF8PROC_CATEGORY_ZS:
    case UTF8PROC_CATEGORY_ZL: case UTF8PROC_CATEGORY_ZP:
      return false;
    default:
      return true;
  }
#else
  if (is_space(cp)) return false;
  if ((cp >= 0x200B && cp <= 0x200F) || (cp >= 0x202A && cp <= 0x202E) || (cp >= 0x2060 && cp <= 0x2064) ||
      cp == 0xFEFF || (cp >= 0xD800 && cp <= 0xF8FF) || cp > 0x10FFFF) {
    return false;
  }
  return true;
#endif
}

std::vector<std::string_view> splitlines(std::string_view text) {
  std::vector<std::string_view> lines;
  size_t start = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t cp_start = pos;
    const char32_t cp = decode(text, pos);
    const bool boundary = cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || cp == 0x1C || cp == 0x1D ||
                          cp == 0x1E || cp == 0x85 || cp == 0x2028 || cp == 0x2029;
    if (!boundary) continue;
    lines.push_back(text.substr(start, cp_start - start));
    if (cp == '\r' && pos < text.size() && text[pos] == '\n') ++pos;
    start = pos;
  }
  if (start < text.size()) lines.push_back(text.substr(start));
  return lines;
}

}  // namespace specula::jinja::unicode
