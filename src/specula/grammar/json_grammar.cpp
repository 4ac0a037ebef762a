// The JSON grammar (json_grammar.h).
#include "specula/grammar/json_grammar.h"

#include <fmt/format.h>

namespace specula::grammar {

std::string json_object_gbnf() {
  // Strings: any code point but '"', '\\' and controls, or an escape (RFC 8259, section 7); a
  // \u escape of a UTF-16 surrogate only as a high-low pair (strict parsers refuse lone ones).
  // Numbers: RFC 8259, section 6 (no leading zeros, no leading '+').
  return fmt::format(R"(root   ::= ws object ws
value  ::= object | array | string | number | "true" | "false" | "null"
object ::= "{{" ws ( string ws ":" ws value ( ws "," ws string ws ":" ws value )* ws )? "}}"
array  ::= "[" ws ( value ( ws "," ws value )* ws )? "]"
string ::= "\"" ( [^"\\\x00-\x1f] | "\\" ( ["\\/bfnrt] | "u" unicode ) )* "\""
unicode ::= ( [0-9a-cA-Ce-fE-F] [0-9a-fA-F]{{3}} | [dD] [0-7] [0-9a-fA-F]{{2}} | [dD] [89abAB] [0-9a-fA-F]{{2}} "\\u" [dD] [c-fC-F] [0-9a-fA-F]{{2}} )
number ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
ws     ::= [ \t]{{0,{}}} ( "\r"? "\n" [ \t]{{0,{}}} )?
)",
                     kMaxJsonSpace, kMaxJsonIndent);
}

Grammar json_object_grammar() { return Grammar::parse(json_object_gbnf()); }

}  // namespace specula::grammar
