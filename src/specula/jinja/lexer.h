// The lexer: template source -> tokens, with jinja2's whitespace control applied to the text
// between tags (`{%-`, `-%}`, `{{-`, `-}}`, `{#-`, `-#}`, the `+` opt-outs) and transformers'
// environment settings trim_blocks=True and lstrip_blocks=True. Comments are dropped here and
// `{% raw %}` bodies become text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace specula::jinja {

enum class TokenType {
  kText,           // template text between tags, already whitespace-controlled
  kVariableBegin,  // {{
  kVariableEnd,    // }}
  kBlockBegin,     // {%
  kBlockEnd,       // %}
  kName,
  kString,   // value: the unescaped literal
  kInteger,  // int_value
  kFloat,    // float_value
  kOperator, // value: + - * / // % ** ~ == != < <= > >= = . , : | ( ) [ ] { } ;
  kEnd,
};

struct Token {
  TokenType type = TokenType::kEnd;
  std::string value;
  int64_t int_value = 0;
  double float_value = 0.0;
  int line = 1;
  int column = 1;  // in code points, 1-based
};

// Throws specula::Error naming the line and column of the problem (unterminated tag, string or
// comment, unexpected character, mismatched brackets).
std::vector<Token> tokenize(std::string_view source);

}  // namespace specula::jinja
