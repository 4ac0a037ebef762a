// Tokenizer following jinja2's lexer (jinja2/lexer.py) rule for rule, so that whitespace
// around tags comes out exactly as transformers renders it.
#include "specula/jinja/lexer.h"

#include <charconv>
#include <cstdlib>

#include "specula/core/error.h"
#include "specula/jinja/unicode.h"

namespace specula::jinja {

namespace {

bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || (c >= '0' && c <= '9'); }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(std::move(source)) {}

  std::vector<Token> run() {
    size_t pos = 0;
    // jinja2 tracks whether the previous match ended a line, so lstrip_blocks can strip the
    // indentation in front of a tag even when trim_blocks already ate the newline before it.
    bool line_starting = true;
    while (pos < src_.size()) {
      const size_t tag = find_tag(pos);
      std::string_view text(src_.data() + pos, (tag == std::string::npos ? src_.size() : tag) - pos);
      if (tag == std::string::npos) {
        emit_text(text, pos);
        break;
      }
      const char kind = src_[tag + 1];  // '{', '%' or '#'
      const char sign = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      emit_text(strip_before_tag(text, sign, kind != '{', line_starting), pos);
      const size_t content = tag + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
      if (kind == '#') {
        pos = lex_comment(tag, content);
      } else if (kind == '%' && is_raw_begin(content)) {
        pos = lex_raw(tag, content);
      } else {
        pos = lex_tag(tag, content, kind == '%');
      }
      line_starting = pos > 0 && src_[pos - 1] == '\n';
    }
    push(TokenType::kEnd, "", src_.size());
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void fail(size_t offset, const std::string& message) const {
    const auto [line, column] = location(offset);
    SPECULA_CHECK(false, "template line {}, column {}: {}", line, column, message);
    std::abort();
  }

  std::pair<int, int> location(size_t offset) const {
    int line = 1;
    size_t line_start = 0;
    for (size_t i = 0; i < offset && i < src_.size(); ++i) {
      if (src_[i] == '\n') {
        ++line;
        line_start = i + 1;
      }
    }
    const size_t end = offset < src_.size() ? offset : src_.size();
    const int column = 1 + static_cast<int>(unicode::code_point_count(std::string_view(src_).substr(line_start, end - line_start)));
    return {line, column};
  }

  Token& push(TokenType type, std::string value, size_t offset) {
    Token token;
    token.type = type;
    token.value = std::move(value);
    // Locations are computed incrementally: tokens come in source order.
    for (; scan_offset_ < offset && scan_offset_ < src_.size(); ++scan_offset_) {
      if (src_[scan_offset_] == '\n') {
        ++scan_line_;
        scan_column_ = 1;
      } else if ((static_cast<unsigned char>(src_[scan_offset_]) & 0xC0) != 0x80) {
        ++scan_column_;
      }
    }
    token.line = scan_line_;
    token.column = scan_column_;
    tokens_.push_back(std::move(token));
    return tokens_.back();
  }

  // The text in front of a tag: `-` strips all trailing whitespace; otherwise lstrip_blocks
  // drops the indentation of a block or comment tag that starts its line.
  static std::string_view strip_before_tag(std::string_view text, char sign, bool is_block, bool line_starting) {
    if (sign == '-') return unicode::strip(text, false, true);
    if (sign == '+' || !is_block) return text;
    const size_t newline = text.rfind('\n');
    const size_t line_start = newline == std::string_view::npos ? 0 : newline + 1;
    const std::string_view tail = text.substr(line_start);
    if ((line_start > 0 || line_starting) && !tail.empty() && unicode::strip(tail, true, false).empty()) {
      return text.substr(0, line_start);
    }
    return text;
  }

  void emit_text(std::string_view text, size_t offset) {
    if (!text.empty()) push(TokenType::kText, std::string(text), offset);
  }

  // The next "{{", "{%" or "{#" at or after pos.
  size_t find_tag(size_t pos) const {
    while (true) {
      pos = src_.find('{', pos);
      if (pos == std::string::npos || pos + 1 >= src_.size()) return std::string::npos;
      const char next = src_[pos + 1];
      if (next == '{' || next == '%' || next == '#') return pos;
      ++pos;
    }
  }

  size_t skip_spaces(size_t pos) const {
    while (pos < src_.size()) {
      size_t next = pos;
      if (!unicode::is_space(unicode::decode(src_, next))) break;
      pos = next;
    }
    return pos;
  }

  // After a block or comment end: `-%}` eats all following whitespace, `+%}` none, and a plain
  // `%}` one newline (trim_blocks).
  size_t after_block_end(size_t end_pos, char before) const {
    if (before == '-') return skip_spaces(end_pos);
    if (before == '+') return end_pos;
    return (end_pos < src_.size() && src_[end_pos] == '\n') ? end_pos + 1 : end_pos;
  }

  size_t lex_comment(size_t tag, size_t content) {
    const size_t close = src_.find("#}", content);
    if (close == std::string::npos) fail(tag, "missing end of comment tag '#}'");
    const char before = close > content ? src_[close - 1] : '\0';
    return after_block_end(close + 2, before == '-' || before == '+' ? before : '\0');
  }

  bool is_raw_begin(size_t content) const {
    const size_t p = skip_spaces(content);
    if (src_.compare(p, 3, "raw") != 0) return false;
    const size_t q = skip_spaces(p + 3);
    return src_.compare(q, 2, "%}") == 0 || src_.compare(q, 3, "-%}") == 0;
  }

  size_t lex_raw(size_t tag, size_t content) {
    size_t p = skip_spaces(skip_spaces(content) + 3);
    // jinja2 applies no trim_blocks after `{% raw %}`, only `-%}`.
    p = src_[p] == '-' ? skip_spaces(p + 3) : p + 2;
    size_t search = p;
    while (true) {
      const size_t end_tag = src_.find("{%", search);
      if (end_tag == std::string::npos) fail(tag, "missing end of raw directive '{% endraw %}'");
      const char sign = end_tag + 2 < src_.size() ? src_[end_tag + 2] : '\0';
      size_t q = skip_spaces(end_tag + 2 + ((sign == '-' || sign == '+') ? 1 : 0));
      if (src_.compare(q, 6, "endraw") != 0) {
        search = end_tag + 2;
        continue;
      }
      q = skip_spaces(q + 6);
      char before = '\0';
      if (src_.compare(q, 3, "-%}") == 0 || src_.compare(q, 3, "+%}") == 0) {
        before = src_[q];
        ++q;
      }
      if (src_.compare(q, 2, "%}") != 0) {
        search = end_tag + 2;
        continue;
      }
      const std::string_view text(src_.data() + p, end_tag - p);
      emit_text(strip_before_tag(text, sign, true, p > 0 && src_[p - 1] == '\n'), p);
      return after_block_end(q + 2, before);
    }
  }

  // Tokens of one {{ ... }} or {% ... %} up to and including its end marker.
  size_t lex_tag(size_t tag, size_t pos, bool is_block) {
    push(is_block ? TokenType::kBlockBegin : TokenType::kVariableBegin, is_block ? "{%" : "{{", tag);
    std::string brackets;  // open ( [ { inside the tag: `}}` inside a dict literal is not the end
    while (true) {
      pos = skip_spaces(pos);
      if (pos >= src_.size()) {
        fail(tag, is_block ? "unexpected end of template: missing '%}' to close the '{%' tag"
                           : "unexpected end of template: missing '}}' to close the '{{' tag");
      }
      if (brackets.empty()) {
        const char* end = is_block ? "%}" : "}}";
        const char sign = src_[pos];
        if ((sign == '-' || (sign == '+' && is_block)) && src_.compare(pos + 1, 2, end) == 0) {
          push(is_block ? TokenType::kBlockEnd : TokenType::kVariableEnd, end, pos);
          return is_block ? after_block_end(pos + 3, sign) : (sign == '-' ? skip_spaces(pos + 3) : pos + 3);
        }
        if (src_.compare(pos, 2, end) == 0) {
          push(is_block ? TokenType::kBlockEnd : TokenType::kVariableEnd, end, pos);
          return is_block ? after_block_end(pos + 2, '\0') : pos + 2;
        }
      }
      const char c = src_[pos];
      if (is_digit(c)) {
        pos = lex_number(pos);
      } else if (is_name_start(c)) {
        size_t end = pos;
        while (end < src_.size() && is_name_char(src_[end])) ++end;
        push(TokenType::kName, src_.substr(pos, end - pos), pos);
        pos = end;
      } else if (c == '\'' || c == '"') {
        pos = lex_string(pos);
      } else {
        pos = lex_operator(pos, brackets);
      }
    }
  }

  size_t lex_number(size_t start) {
    // Digits with optional '_' separators, as jinja2 accepts.
    const auto digits = [&](size_t p, auto accept) {
      while (p < src_.size() && (accept(src_[p]) || (src_[p] == '_' && p + 1 < src_.size() && accept(src_[p + 1])))) ++p;
      return p;
    };
    const auto dec = [](char c) { return is_digit(c); };
    const auto clean = [&](size_t from, size_t to) {
      std::string s;
      for (size_t i = from; i < to; ++i) {
        if (src_[i] != '_') s.push_back(src_[i]);
      }
      return s;
    };
    if (src_[start] == '0' && start + 1 < src_.size()) {
      const char prefix = static_cast<char>(src_[start + 1] | 0x20);
      int base = prefix == 'x' ? 16 : prefix == 'o' ? 8 : prefix == 'b' ? 2 : 0;
      if (base != 0) {
        const auto accept = [base](char c) {
          const char l = static_cast<char>(c | 0x20);
          return base == 16 ? (is_digit(c) || (l >= 'a' && l <= 'f')) : (c >= '0' && c < '0' + base);
        };
        size_t p = start + 2;
        if (p < src_.size() && src_[p] == '_') ++p;
        const size_t end = digits(p, accept);
        if (end == p) fail(start, "invalid integer literal");
        push_integer(clean(p, end), base, start);
        return end;
      }
    }
    size_t end = digits(start, dec);
    bool is_float = false;
    if (end + 1 < src_.size() && src_[end] == '.' && is_digit(src_[end + 1])) {
      end = digits(end + 1, dec);
      is_float = true;
    }
    if (end < src_.size() && (src_[end] == 'e' || src_[end] == 'E')) {
      size_t p = end + 1;
      if (p < src_.size() && (src_[p] == '+' || src_[p] == '-')) ++p;
      if (p < src_.size() && is_digit(src_[p])) {
        end = digits(p, dec);
        is_float = true;
      }
    }
    const std::string text = clean(start, end);
    if (is_float) {
      Token& token = push(TokenType::kFloat, text, start);
      token.float_value = std::strtod(text.c_str(), nullptr);
    } else {
      push_integer(text, 10, start);
    }
    return end;
  }

  void push_integer(const std::string& text, int base, size_t offset) {
    int64_t value = 0;
    const auto result = std::from_chars(text.data(), text.data() + text.size(), value, base);
    if (result.ec != std::errc() || result.ptr != text.data() + text.size()) {
      fail(offset, "integer literal " + text + " does not fit in 64 bits");
    }
    Token& token = push(TokenType::kInteger, text, offset);
    token.int_value = value;
  }

  // Python string literal escapes (jinja2 decodes literals with "unicode-escape"); unknown
  // escapes keep their backslash, as Python does.
  size_t lex_string(size_t start) {
    const char quote = src_[start];
    std::string value;
    size_t p = start + 1;
    while (true) {
      if (p >= src_.size()) fail(start, "unterminated string literal");
      const char c = src_[p];
      if (c == quote) break;
      if (c != '\\') {
        value.push_back(c);
        ++p;
        continue;
      }
      if (p + 1 >= src_.size()) fail(start, "unterminated string literal");
      const char e = src_[p + 1];
      p += 2;
      switch (e) {
        case 'n': value.push_back('\n'); break;
        case 't': value.push_back('\t'); break;
        case 'r': value.push_back('\r'); break;
        case '\\': value.push_back('\\'); break;
        case '\'': value.push_back('\''); break;
        case '"': value.push_back('"'); break;
        case 'a': value.push_back('\a'); break;
        case 'b': value.push_back('\b'); break;
        case 'f': value.push_back('\f'); break;
        case 'v': value.push_back('\v'); break;
        case '\n': break;  // line continuation
        case 'x': case 'u': case 'U': {
          const size_t width = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          const auto result = std::from_chars(src_.data() + p, src_.data() + std::min(p + width, src_.size()), cp, 16);
          if (result.ec != std::errc() || result.ptr != src_.data() + p + width || cp > 0x10FFFF) {
            fail(p - 2, std::string("invalid \\") + e + " escape in string literal");
          }
          unicode::encode(cp, value);
          p += width;
          break;
        }
        case 'N':
          fail(p - 2, "\\N{...} escapes in string literals are not supported");
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = static_cast<uint32_t>(e - '0');
            for (int i = 0; i < 2 && p < src_.size() && src_[p] >= '0' && src_[p] <= '7'; ++i) cp = cp * 8 + (src_[p++] - '0');
            unicode::encode(cp, value);
          } else {
            value.push_back('\\');
            value.push_back(e);
          }
      }
    }
    push(TokenType::kString, std::move(value), start);
    return p + 1;
  }

  size_t lex_operator(size_t pos, std::string& brackets) {
    static constexpr std::string_view kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
    for (std::string_view op : kTwo) {
      if (src_.compare(pos, 2, op) == 0) {
        push(TokenType::kOperator, std::string(op), pos);
        return pos + 2;
      }
    }
    const char c = src_[pos];
    static constexpr std::string_view kOne = "+-/*%~[](){}><=.:|,;";
    if (kOne.find(c) == std::string_view::npos) {
      size_t next = pos;
      const char32_t cp = unicode::decode(src_, next);
      std::string shown;
      unicode::encode(cp, shown);
      fail(pos, "unexpected character '" + shown + "' in tag");
    }
    if (c == '(' || c == '[' || c == '{') {
      brackets.push_back(c);
    } else if (c == ')' || c == ']' || c == '}') {
      const char open = c == ')' ? '(' : c == ']' ? '[' : '{';
      if (brackets.empty()) fail(pos, std::string("unexpected '") + c + "'");
      if (brackets.back() != open) {
        fail(pos, std::string("unexpected '") + c + "', expected the closing bracket of '" + brackets.back() + "'");
      }
      brackets.pop_back();
    }
    push(TokenType::kOperator, std::string(1, c), pos);
    return pos + 1;
  }

  std::string src_;
  std::vector<Token> tokens_;
  size_t scan_offset_ = 0;
  int scan_line_ = 1;
  int scan_column_ = 1;
};

// jinja2 reads templates with universal newlines and, with keep_trailing_newline=False (as
// transformers leaves it), drops one final newline.
std::string normalize_newlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out.push_back(source[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

}  // namespace

std::vector<Token> tokenize(std::string_view source) { return Lexer(normalize_newlines(source)).run(); }

}  // namespace specula::jinja
