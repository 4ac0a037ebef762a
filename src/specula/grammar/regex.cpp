// The regex-to-GBNF translation (regex.h).
#include "specula/grammar/regex.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <optional>
#include <utility>
#include <vector>

#include "specula/core/error.h"
#include "specula/grammar/code_points.h"
#include "specula/grammar/utf8.h"

namespace specula::grammar {

namespace {

using Ranges = CodePointRanges;

const Ranges kDigits = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
// ECMAScript's WhiteSpace and LineTerminator.
const Ranges kSpace = {{0x09, 0x0D}, {0x20, 0x20}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A}, {0x2028, 0x2029},
                       {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
const Ranges kLineTerminators = {{0x0A, 0x0A}, {0x0D, 0x0D}, {0x2028, 0x2029}};

std::string cp(uint32_t c) { return fmt::format("\\U{:08X}", c); }

class Translator {
 public:
  Translator(std::string_view p, const Ranges* within) : p_(p), within_(within) {}

  std::string body() {
    if (!p_.empty() && p_[0] == '^') ++pos_;
    std::string body = alternation();
    if (pos_ < p_.size() && p_[pos_] == ')') fail(pos_, "unmatched ')'");
    return body;
  }

 private:
  // A class, narrowed to `within`; refused when nothing of it is left.
  std::string class_text(const Ranges& r) const {
    const Ranges kept = within_ == nullptr ? merge_ranges(r)
                                            : complement_ranges(merge_ranges([&] {
                                                Ranges both = complement_ranges(r);
                                                const Ranges out = complement_ranges(*within_);
                                                both.insert(both.end(), out.begin(), out.end());
                                                return both;
                                              }()));
    if (kept.empty()) fail(pos_, "this part of the pattern can only match characters that are not allowed here");
    std::string s = "[";
    for (const auto& [lo, hi] : kept) s += lo == hi ? cp(lo) : cp(lo) + "-" + cp(hi);
    return s + "]";
  }
  std::string literal(uint32_t c) const {
    if (within_ != nullptr && std::none_of(within_->begin(), within_->end(), [c](const auto& x) { return x.first <= c && c <= x.second; })) {
      fail(pos_, fmt::format("U+{:04X} is not allowed here", c));
    }
    return "\"" + cp(c) + "\"";
  }

  [[noreturn]] void fail(size_t at, const std::string& what) const {
    throw Error(fmt::format("regex: position {}: {}", at, what));
  }

  bool at_end_anchor() const { return pos_ + 1 == p_.size() && p_[pos_] == '$'; }

  std::string alternation() {
    std::vector<std::string> alts = {sequence()};
    while (pos_ < p_.size() && p_[pos_] == '|') {
      ++pos_;
      alts.push_back(sequence());
    }
    if (alts.size() == 1) return alts[0];
    std::string s = "(";
    for (size_t i = 0; i < alts.size(); ++i) s += (i ? " | " : " ") + alts[i];
    return s + " )";
  }

  std::string sequence() {
    std::vector<std::string> items;
    while (pos_ < p_.size() && p_[pos_] != '|' && p_[pos_] != ')') {
      if (at_end_anchor()) {
        ++pos_;
        break;
      }
      std::string a = atom();
      items.push_back(quantified(std::move(a)));
    }
    if (items.empty()) return "\"\"";
    std::string s = "(";
    for (const std::string& i : items) s += " " + i;
    return s + " )";
  }

  std::string quantified(std::string a) {
    if (pos_ >= p_.size()) return a;
    const size_t at = pos_;
    const char c = p_[pos_];
    std::string op;
    if (c == '*' || c == '+' || c == '?') {
      ++pos_;
      op = std::string(1, c);
    } else if (c == '{') {
      ++pos_;
      const std::string lo = digits(at);
      std::string hi = lo;
      bool open = false;
      if (pos_ < p_.size() && p_[pos_] == ',') {
        ++pos_;
        if (pos_ < p_.size() && p_[pos_] == '}') {
          open = true;
        } else {
          hi = digits(at);
        }
      }
      if (pos_ >= p_.size() || p_[pos_] != '}') fail(at, "'{' must start a quantifier {m}, {m,} or {m,n} (write \\{ for a brace)");
      ++pos_;
      op = open ? "{" + lo + ",}" : "{" + lo + "," + hi + "}";
    } else {
      return a;
    }
    if (pos_ < p_.size() && p_[pos_] == '?') ++pos_;  // lazy: the same strings match
    if (pos_ < p_.size() && (p_[pos_] == '*' || p_[pos_] == '+' || p_[pos_] == '?' || p_[pos_] == '{')) {
      fail(pos_, "a quantifier cannot follow a quantifier");
    }
    return "(" + a + ")" + op;
  }

  std::string digits(size_t at) {
    const size_t start = pos_;
    while (pos_ < p_.size() && std::isdigit(static_cast<unsigned char>(p_[pos_]))) ++pos_;
    if (pos_ == start) fail(at, "'{' must start a quantifier {m}, {m,} or {m,n} (write \\{ for a brace)");
    return std::string(p_.substr(start, pos_ - start));
  }

  uint32_t next_code_point() {
    uint32_t c = 0;
    const size_t n = decode_utf8(p_.substr(pos_), c);
    if (n == 0) fail(pos_, "invalid UTF-8 in the pattern");
    pos_ += n;
    return c;
  }

  std::string atom() {
    const size_t at = pos_;
    const char c = p_[pos_];
    if (c == '(') {
      ++pos_;
      if (p_.substr(pos_, 2) == "?:") {
        pos_ += 2;
      } else if (p_.substr(pos_, 2) == "?<" && pos_ + 2 < p_.size() && p_[pos_ + 2] != '=' && p_[pos_ + 2] != '!') {
        const size_t close = p_.find('>', pos_);
        if (close == std::string_view::npos) fail(at, "unterminated group name");
        pos_ = close + 1;
      } else if (pos_ < p_.size() && p_[pos_] == '?') {
        fail(at, "lookahead, lookbehind and inline flags are not supported; supported groups: (...), (?:...), (?<name>...)");
      }
      std::string inner = alternation();
      if (pos_ >= p_.size() || p_[pos_] != ')') fail(at, "unclosed '('");
      ++pos_;
      return "(" + inner + ")";
    }
    if (c == '[') return class_text(bracket());
    if (c == '.') {
      ++pos_;
      return class_text(complement_ranges(kLineTerminators));
    }
    if (c == '\\') return escape_atom();
    if (c == '^' || c == '$') fail(at, "anchors are supported only at the start (^) and the end ($) of the pattern");
    if (c == '*' || c == '+' || c == '?' || c == '{') fail(at, fmt::format("nothing to repeat before '{}'", c));
    if (c == ']' || c == '}') fail(at, fmt::format("unescaped '{}' (write \\{})", c, c));
    return literal(next_code_point());
  }

  // An escape outside a class: a code point or a class.
  std::string escape_atom() {
    Ranges r;
    const std::optional<uint32_t> one = escape(r, false);
    return one ? literal(*one) : class_text(r);
  }

  // Reads an escape at pos_ (a backslash): its code point, or (nullopt) the class it names in r.
  std::optional<uint32_t> escape(Ranges& r, bool in_class) {
    const size_t at = pos_;
    if (pos_ + 1 >= p_.size()) fail(at, "the pattern ends with a lone backslash");
    const char e = p_[pos_ + 1];
    pos_ += 2;
    switch (e) {
      case 'n': return '\n';
      case 'r': return '\r';
      case 't': return '\t';
      case 'f': return '\f';
      case 'v': return '\v';
      case '0': return 0;
      case 'd': r = kDigits; return std::nullopt;
      case 'D': r = complement_ranges(kDigits); return std::nullopt;
      case 'w': r = kWord; return std::nullopt;
      case 'W': r = complement_ranges(kWord); return std::nullopt;
      case 's': r = kSpace; return std::nullopt;
      case 'S': r = complement_ranges(kSpace); return std::nullopt;
      case 'x': return hex(at, 2);
      case 'u':
        if (pos_ < p_.size() && p_[pos_] == '{') {
          ++pos_;
          const size_t close = p_.find('}', pos_);
          if (close == std::string_view::npos || close == pos_ || close - pos_ > 6) fail(at, "\\u{...} needs 1 to 6 hex digits");
          const uint32_t v = hex(at, static_cast<int>(close - pos_));
          ++pos_;
          return v;
        }
        return hex(at, 4);
      case 'b':
        if (in_class) return '\b';
        fail(at, "word boundaries (\\b, \\B) are not supported");
      case 'B': fail(at, "word boundaries (\\b, \\B) are not supported");
      default: break;
    }
    if (std::isdigit(static_cast<unsigned char>(e))) fail(at, "backreferences are not supported");
    if (std::ispunct(static_cast<unsigned char>(e))) return static_cast<uint32_t>(static_cast<unsigned char>(e));
    fail(at, fmt::format("escape '\\{}' is not supported; supported: \\n \\r \\t \\f \\v \\0 \\xHH \\uHHHH \\u{{H}} \\d \\D "
                         "\\w \\W \\s \\S and escaped punctuation",
                         e));
  }

  uint32_t hex(size_t at, int n) {
    uint32_t v = 0;
    for (int i = 0; i < n; ++i) {
      if (pos_ >= p_.size() || !std::isxdigit(static_cast<unsigned char>(p_[pos_]))) fail(at, "bad hex escape");
      const char h = p_[pos_++];
      v = v * 16 + hex_digit(h);
    }
    if (v > kMaxCodePoint || (v >= 0xD800 && v <= 0xDFFF)) fail(at, fmt::format("U+{:X} is not a code point", v));
    return v;
  }

  Ranges bracket() {
    const size_t at = pos_;
    ++pos_;
    const bool negate = pos_ < p_.size() && p_[pos_] == '^';
    if (negate) ++pos_;
    Ranges r;
    while (true) {
      if (pos_ >= p_.size()) fail(at, "unterminated character class");
      if (p_[pos_] == ']') break;
      Ranges named;
      std::optional<uint32_t> lo;
      if (p_[pos_] == '\\') {
        lo = escape(named, true);
      } else {
        lo = next_code_point();
      }
      if (!lo) {
        r.insert(r.end(), named.begin(), named.end());
        continue;
      }
      uint32_t hi = *lo;
      if (pos_ + 1 < p_.size() && p_[pos_] == '-' && p_[pos_ + 1] != ']') {
        ++pos_;
        Ranges other;
        const std::optional<uint32_t> end = p_[pos_] == '\\' ? escape(other, true) : std::optional<uint32_t>(next_code_point());
        if (!end) fail(at, "a class escape (\\d, \\w, \\s...) cannot end a range");
        hi = *end;
        if (hi < *lo) fail(at, "a range in a class is reversed");
      }
      r.emplace_back(*lo, hi);
    }
    ++pos_;
    if (negate) return complement_ranges(r);
    if (r.empty()) fail(at, "an empty class [] matches nothing");
    return r;
  }

  std::string_view p_;
  size_t pos_ = 0;
  const Ranges* within_ = nullptr;  // every character must lie here (none: any)
};

}  // namespace

std::string regex_to_gbnf(std::string_view pattern) { return "root ::= " + Translator(pattern, nullptr).body() + "\n"; }

std::string regex_expression(std::string_view pattern, const CodePointRanges& within) {
  return Translator(pattern, &within).body();
}

Grammar compile_regex(std::string_view pattern, const Limits& limits) { return Grammar::parse(regex_to_gbnf(pattern), limits); }

}  // namespace specula::grammar
