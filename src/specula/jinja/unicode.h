// UTF-8 helpers for the Jinja interpreter. Python strings are sequences of code points, so
// len(), indexing, slicing, strip() and split() must count code points, not bytes, to render
// what transformers renders.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace specula::jinja::unicode {

// Decodes one code point at text[pos] and advances pos. Invalid bytes decode as themselves
// (one byte each) so malformed input never loops or throws; they round-trip through encode
// unchanged because encode_raw writes them back as single bytes.
char32_t decode(std::string_view text, size_t& pos);
void encode(char32_t cp, std::string& out);

// Byte offsets of every code point start, plus text.size() at the end: offsets.size() - 1 is
// the code point count.
std::vector<size_t> code_point_offsets(std::string_view text);
size_t code_point_count(std::string_view text);
bool is_ascii(std::string_view text);

// Python's str.isspace() for one code point (Unicode White_Space plus the \x1c-\x1f separators).
bool is_space(char32_t cp);

// Python's str.strip()/lstrip()/rstrip(): chars == nullptr strips whitespace, otherwise any
// code point in *chars.
std::string_view strip(std::string_view text, bool left, bool right, const std::string_view* chars = nullptr);

// Case mapping of one code point: full Unicode (simple mappings) with utf8proc, ASCII otherwise.
char32_t to_upper(char32_t cp);
char32_t to_lower(char32_t cp);
bool is_alpha(char32_t cp);  // for str.title(): Python's word boundaries are non-letters
std::string upper(std::string_view text);
std::string lower(std::string_view text);

// Whether Python's repr() prints the code point as is (str.isprintable()); others are escaped.
bool is_printable(char32_t cp);

// Python's str.splitlines() boundaries: \n \r \r\n \v \f \x1c \x1d \x1e \x85 \u2028 \u2029.
std::vector<std::string_view> splitlines(std::string_view text);

}  // namespace specula::jinja::unicode
