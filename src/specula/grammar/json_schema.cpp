// The JSON-Schema-to-GBNF conversion (json_schema.h).
#include "specula/grammar/json_schema.h"

#include <fmt/format.h>

#include <cctype>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "specula/core/error.h"
#include "specula/grammar/json_grammar.h"
#include "specula/grammar/regex.h"
#include "specula/grammar/utf8.h"

namespace specula::grammar {

namespace {

using json = nlohmann::ordered_json;

// Integer bounds beyond this are refused: JSON numbers past 2^53 are not exact in most parsers.
// For the same reason generated numbers have at most 16 integer digits, 16 fraction digits and a
// two-digit exponent: every parser reads them as finite doubles (1e999 is refused by some and
// becomes Infinity, which no schema's "number" accepts, in others).
constexpr double kMaxIntegerBound = 9007199254740991.0;

// The code points a JSON string holds unescaped.
const CodePointRanges kStringChars = {{0x20, 0x21}, {0x23, 0x5B}, {0x5D, kMaxCodePoint}};

// A GBNF literal of UTF-8 text.
std::string literal(std::string_view text) {
  std::string s = "\"";
  for (size_t i = 0; i < text.size();) {
    uint32_t c = 0;
    const size_t n = decode_utf8(text.substr(i), c);
    if (n == 0) throw Error("json_schema: a string of the schema is not valid UTF-8");
    i += n;
    if (c == '"' || c == '\\') s += fmt::format("\\x{:02X}", c);
    else if (c < 0x20 || c == 0x7F) s += fmt::format("\\x{:02X}", c);
    else s.append(text.substr(i - n, n));
  }
  return s + "\"";
}

std::string digits_class(char lo, char hi) { return lo == hi ? fmt::format("\"{}\"", lo) : fmt::format("[{}-{}]", lo, hi); }

// Decimal strings of one length n in [a, b] (a <= b, both n digits).
std::string same_length_range(const std::string& a, const std::string& b) {
  const size_t n = a.size();
  if (n == 0) return "\"\"";
  if (a == b) return literal(a);
  if (a[0] == b[0]) return literal(a.substr(0, 1)) + " " + same_length_range(a.substr(1), b.substr(1));
  const std::string rest_lo(n - 1, '0'), rest_hi(n - 1, '9');
  const auto any = [&](size_t k) { return k == 0 ? std::string() : fmt::format(" [0-9]{{{}}}", k); };
  if (a.substr(1) == rest_lo && b.substr(1) == rest_hi) return digits_class(a[0], b[0]) + any(n - 1);
  std::vector<std::string> alts;
  alts.push_back(literal(a.substr(0, 1)) + " " + (n > 1 ? "( " + same_length_range(a.substr(1), rest_hi) + " )" : ""));
  if (a[0] + 1 <= b[0] - 1) alts.push_back(digits_class(static_cast<char>(a[0] + 1), static_cast<char>(b[0] - 1)) + any(n - 1));
  alts.push_back(literal(b.substr(0, 1)) + " " + (n > 1 ? "( " + same_length_range(rest_lo, b.substr(1)) + " )" : ""));
  std::string s = "(";
  for (size_t i = 0; i < alts.size(); ++i) s += (i ? " | " : " ") + alts[i];
  return s + " )";
}

// Non-negative integers (no leading zeros) in [lo, hi]; hi absent: no upper bound.
std::string natural_range(uint64_t lo, std::optional<uint64_t> hi) {
  const std::string l = std::to_string(lo);
  std::vector<std::string> alts;
  const size_t top = hi ? std::to_string(*hi).size() : l.size();
  for (size_t d = l.size(); d <= top; ++d) {
    const std::string from = d == l.size() ? l : "1" + std::string(d - 1, '0');
    const std::string to = hi && d == top ? std::to_string(*hi) : std::string(d, '9');
    alts.push_back(same_length_range(from, to));
  }
  if (!hi && l.size() < 16) alts.push_back(fmt::format("[1-9] [0-9]{{{},15}}", l.size()));
  std::string s = "(";
  for (size_t i = 0; i < alts.size(); ++i) s += (i ? " | " : " ") + alts[i];
  return s + " )";
}

class SchemaConverter {
 public:
  explicit SchemaConverter(const json& root) : root_(root) {}

  std::string run() {
    const std::string top = visit(root_, "");
    std::string out = "root ::= ws " + top + " ws\n";
    for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
    out += fmt::format("ws ::= [ \\t]{{0,{}}} ( \"\\r\"? \"\\n\" [ \\t]{{0,{}}} )?\n", kMaxJsonSpace, kMaxJsonIndent);
    return out;
  }

 private:
  [[noreturn]] static void fail(const std::string& at, const std::string& what) {
    throw Error(fmt::format("json_schema: at {}: {}", at.empty() ? "the root" : "'" + at + "'", what));
  }

  // A rule named after `hint` holding body; returns its name.
  std::string rule(const std::string& hint, const std::string& body) {
    const std::string name = fresh(hint);
    rules_.emplace_back(name, body);
    return name;
  }
  std::string fresh(const std::string& hint) {
    std::string base;
    for (char c : hint) base += std::isalnum(static_cast<unsigned char>(c)) ? static_cast<char>(std::tolower(c)) : '-';
    if (base.empty() || !std::isalpha(static_cast<unsigned char>(base[0]))) base = "s-" + base;
    if (base.size() > 40) base.resize(40);
    std::string name = base;
    for (int i = 2; names_.contains(name) || name == "root" || name == "ws"; ++i) name = fmt::format("{}-{}", base, i);
    names_.insert(name);
    return name;
  }
  // The shared rules of plain JSON values, added once when first used.
  std::string common(const std::string& name) {
    if (common_.insert(name).second) {
      static const std::map<std::string, std::string> kBodies = {
          {"json-char", R"([^"\\\x00-\x1f] | "\\" ( ["\\/bfnrt] | "u" ( [0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2} | [dD] [89abAB] [0-9a-fA-F]{2} "\\u" [dD] [c-fC-F] [0-9a-fA-F]{2} ) ))"},
          {"json-string", R"("\"" json-char* "\"")"},
          {"json-number", R"("-"? ( "0" | [1-9] [0-9]{0,15} ) ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,2} )?)"},
          {"json-integer", R"("-"? ( "0" | [1-9] [0-9]{0,15} ))"},
          {"json-value", R"(json-object | json-array | json-string | json-number | "true" | "false" | "null")"},
          {"json-object", R"("{" ws ( json-string ws ":" ws json-value ws ( "," ws json-string ws ":" ws json-value ws )* )? "}")"},
          {"json-array", R"("[" ws ( json-value ws ( "," ws json-value ws )* )? "]")"},
      };
      static const std::map<std::string, std::vector<std::string>> kUses = {
          {"json-string", {"json-char"}},
          {"json-value", {"json-object", "json-array", "json-string", "json-number"}},
          {"json-object", {"json-string", "json-value"}},
          {"json-array", {"json-value"}},
      };
      rules_.emplace_back(name, kBodies.at(name));
      if (const auto it = kUses.find(name); it != kUses.end()) {
        for (const std::string& u : it->second) common(u);
      }
    }
    return name;
  }

  static bool is_annotation(const std::string& key) {
    static const std::set<std::string> kKeys = {"title",   "description", "default",  "examples", "$schema",
                                                "$id",     "$comment",    "deprecated", "readOnly", "writeOnly",
                                                "$defs",   "definitions"};
    return kKeys.contains(key);
  }

  // The expression for schema s at JSON pointer `at`.
  std::string visit(const json& s, const std::string& at) {
    if (s.is_boolean()) {
      if (!s.get<bool>()) fail(at, "the schema false accepts nothing");
      return common("json-value");
    }
    if (!s.is_object()) fail(at, "a schema must be an object or a boolean");
    static const std::set<std::string> kKnown = {
        "type",     "properties", "required", "additionalProperties", "enum",      "const",     "items",
        "prefixItems", "minItems", "maxItems", "anyOf",              "oneOf",     "allOf",     "$ref",
        "minLength", "maxLength", "pattern",  "format",               "minimum",   "maximum",   "exclusiveMinimum",
        "exclusiveMaximum"};
    for (const auto& [key, value] : s.items()) {
      if (!kKnown.contains(key) && !is_annotation(key)) {
        fail(at, fmt::format("the keyword '{}' is not supported (supported: type, properties, required, "
                             "additionalProperties, enum, const, items, prefixItems, minItems, maxItems, anyOf, oneOf, "
                             "allOf, $ref, minLength, maxLength, pattern, format, minimum, maximum, exclusiveMinimum, "
                             "exclusiveMaximum)",
                             key));
      }
    }
    if (s.contains("$ref")) return reference(s, at);
    if (s.contains("allOf")) return visit(merge_all_of(s, at), at);
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!s.contains(key)) continue;
      const json& branches = s[key];
      if (!branches.is_array() || branches.empty()) fail(at, fmt::format("{} must be a non-empty array", key));
      for (const auto& [k, v] : s.items()) {
        if (k != key && !is_annotation(k)) fail(at, fmt::format("'{}' beside {} is not supported; move it into the branches", k, key));
      }
      std::vector<std::string> alts;
      for (size_t i = 0; i < branches.size(); ++i) alts.push_back(visit(branches[i], fmt::format("{}/{}/{}", at, key, i)));
      return alternatives(alts);
    }
    if (s.contains("const")) return literal(s["const"].dump());
    if (s.contains("enum")) {
      const json& values = s["enum"];
      if (!values.is_array() || values.empty()) fail(at + "/enum", "enum must be a non-empty array");
      std::vector<std::string> alts;
      for (const json& v : values) alts.push_back(literal(v.dump()));
      return alternatives(alts);
    }
    if (!s.contains("type")) {
      if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required")) return object(s, at);
      if (s.contains("items") || s.contains("prefixItems")) return array(s, at);
      if (s.contains("pattern") || s.contains("format") || s.contains("minLength") || s.contains("maxLength")) return string(s, at);
      return common("json-value");
    }
    const json& type = s["type"];
    if (type.is_array()) {
      if (type.empty()) fail(at + "/type", "type must name at least one type");
      std::vector<std::string> alts;
      for (const json& t : type) alts.push_back(typed(s, t, at));
      return alternatives(alts);
    }
    return typed(s, type, at);
  }

  std::string alternatives(const std::vector<std::string>& alts) {
    if (alts.size() == 1) return alts[0];
    std::string s = "(";
    for (size_t i = 0; i < alts.size(); ++i) s += (i ? " | " : " ") + alts[i];
    return s + " )";
  }

  std::string typed(const json& s, const json& type, const std::string& at) {
    if (!type.is_string()) fail(at + "/type", "type must be a string or an array of strings");
    const std::string t = type.get<std::string>();
    if (t == "string") return string(s, at);
    if (t == "integer") return integer(s, at);
    if (t == "number") return number(s, at);
    if (t == "boolean") return "( \"true\" | \"false\" )";
    if (t == "null") return "\"null\"";
    if (t == "object") return object(s, at);
    if (t == "array") return array(s, at);
    fail(at + "/type", fmt::format("unknown type '{}' (string, integer, number, boolean, null, object, array)", t));
  }

  // Counts beyond the grammar's repetition limit would fail later, naming GBNF the user never wrote.
  static std::optional<uint64_t> count(const json& s, const char* key, const std::string& at) {
    if (!s.contains(key)) return std::nullopt;
    const json& v = s[key];
    const auto most = static_cast<uint64_t>(Limits{}.max_repeat);
    if (!v.is_number_unsigned() || v.get<uint64_t>() > most) {
      fail(at + "/" + key, fmt::format("{} must be an integer in [0, {}] (the largest count supported)", key, most));
    }
    return v.get<uint64_t>();
  }

  std::string string(const json& s, const std::string& at) {
    const auto min = count(s, "minLength", at), max = count(s, "maxLength", at);
    if (min && max && *min > *max) fail(at, "minLength is above maxLength");
    if (s.contains("pattern") || s.contains("format")) {
      if (min || max) fail(at, "minLength / maxLength beside pattern or format are not supported");
      if (s.contains("pattern") && s.contains("format")) fail(at, "pattern beside format is not supported");
      std::string expression;
      if (s.contains("pattern")) {
        if (!s["pattern"].is_string()) fail(at + "/pattern", "pattern must be a string");
        try {
          expression = regex_expression(s["pattern"].get<std::string>(), kStringChars);
        } catch (const Error& e) {
          fail(at + "/pattern", e.what());
        }
      } else {
        expression = format(s["format"], at + "/format");
      }
      return "\"\\\"\" " + expression + " \"\\\"\"";
    }
    common("json-char");
    if (!min && !max) return common("json-string");
    const std::string bound = max ? fmt::format("{{{},{}}}", min.value_or(0), *max) : fmt::format("{{{},}}", *min);
    return "\"\\\"\" json-char" + bound + " \"\\\"\"";
  }

  std::string format(const json& f, const std::string& at) {
    if (!f.is_string()) fail(at, "format must be a string");
    const std::string name = f.get<std::string>();
    // Days valid in every year (February to the 28th): each generated date exists.
    static const std::string kDate =
        R"([0-9]{4} "-" ( ( "0" [13578] | "1" [02] ) "-" ( "0" [1-9] | [12] [0-9] | "3" [01] ) | ( "0" [469] | "11" ) "-" ( "0" [1-9] | [12] [0-9] | "30" ) | "02-" ( "0" [1-9] | "1" [0-9] | "2" [0-8] ) ))";
    static const std::string kTime =
        R"(( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{1,9} )? ( "Z" | [+-] ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ))";
    static const std::string kOctet = R"(( "25" [0-5] | "2" [0-4] [0-9] | "1" [0-9] [0-9] | [1-9]? [0-9] ))";
    if (name == "date") return "( " + kDate + " )";
    if (name == "time") return "( " + kTime + " )";
    if (name == "date-time") return "( " + kDate + " \"T\" " + kTime + " )";
    if (name == "uuid") return R"(( [0-9a-f]{8} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{12} ))";
    if (name == "ipv4") return "( " + kOctet + " \".\" " + kOctet + " \".\" " + kOctet + " \".\" " + kOctet + " )";
    if (name == "email") {
      // Dot-separated atoms, then dot-separated labels that start and end with a letter or digit.
      return R"(( [a-z0-9_+-]{1,20} ( "." [a-z0-9_+-]{1,20} ){0,3} "@" ( [a-z0-9] ( [a-z0-9-]{0,20} [a-z0-9] )? "." ){1,3} [a-z]{2,10} ))";
    }
    fail(at, fmt::format("format '{}' is not supported (date, time, date-time, uuid, ipv4, email)", name));
  }

  // A numeric bound as a double, or nullopt.
  static std::optional<double> bound(const json& s, const char* key, const std::string& at) {
    if (!s.contains(key)) return std::nullopt;
    if (!s[key].is_number()) fail(at + "/" + key, fmt::format("{} must be a number", key));
    return s[key].get<double>();
  }

  std::string integer(const json& s, const std::string& at) {
    std::optional<double> lo = bound(s, "minimum", at), hi = bound(s, "maximum", at);
    if (const auto x = bound(s, "exclusiveMinimum", at)) lo = lo ? std::max(*lo, std::floor(*x) + 1) : std::floor(*x) + 1;
    if (const auto x = bound(s, "exclusiveMaximum", at)) hi = hi ? std::min(*hi, std::ceil(*x) - 1) : std::ceil(*x) - 1;
    if (lo) lo = std::ceil(*lo);
    if (hi) hi = std::floor(*hi);
    for (const auto& b : {lo, hi}) {
      if (b && std::fabs(*b) > kMaxIntegerBound) fail(at, fmt::format("integer bounds beyond ±{} are not supported", kMaxIntegerBound));
    }
    if (!lo && !hi) return common("json-integer");
    if (lo && hi && *lo > *hi) fail(at, "no integer lies within minimum and maximum");
    std::vector<std::string> alts;
    // Negative values: "-" and a magnitude in [1 or -hi, -lo or unbounded].
    if (!lo || *lo < 0) {
      const auto m_lo = static_cast<uint64_t>(hi && *hi < 0 ? -*hi : 1);
      const std::optional<uint64_t> m_hi = lo ? std::optional<uint64_t>(static_cast<uint64_t>(-*lo)) : std::nullopt;
      alts.push_back("\"-\" " + natural_range(m_lo, m_hi));
    }
    if (!hi || *hi >= 0) {
      const auto n_lo = static_cast<uint64_t>(lo && *lo > 0 ? *lo : 0);
      const std::optional<uint64_t> n_hi = hi ? std::optional<uint64_t>(static_cast<uint64_t>(*hi)) : std::nullopt;
      alts.push_back(natural_range(n_lo, n_hi));
    }
    return alternatives(alts);
  }

  std::string number(const json& s, const std::string& at) {
    const auto lo = bound(s, "minimum", at);
    if (s.contains("maximum") || s.contains("exclusiveMinimum") || s.contains("exclusiveMaximum") || (lo && *lo != 0)) {
      fail(at, "bounds on a number are supported only as minimum: 0 (use type integer for other bounds)");
    }
    if (lo) return R"(( ( "0" | [1-9] [0-9]{0,15} ) ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,2} )? ))";
    return common("json-number");
  }

  std::string object(const json& s, const std::string& at) {
    struct Property {
      std::string key, value;
      bool required;
    };
    std::vector<Property> props;
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) fail(at + "/required", "required must be an array of strings");
      for (const json& r : s["required"]) {
        if (!r.is_string()) fail(at + "/required", "required must be an array of strings");
        required.insert(r.get<std::string>());
      }
    }
    std::set<std::string> declared;
    if (s.contains("properties")) {
      if (!s["properties"].is_object()) fail(at + "/properties", "properties must be an object");
      for (const auto& [name, sub] : s["properties"].items()) {
        const std::string value = visit(sub, at + "/properties/" + name);
        props.push_back({literal(json(name).dump()), value, required.contains(name)});
        declared.insert(name);
      }
    }
    for (const std::string& r : required) {
      if (!declared.contains(r)) fail(at + "/required", fmt::format("'{}' is required but not among the properties", r));
    }
    // Extra keys: additionalProperties true or a schema; absent counts as false when properties
    // are declared (only declared keys are generated) and as true for a bare {"type": "object"}.
    std::string extra;
    const json* additional = s.contains("additionalProperties") ? &s["additionalProperties"] : nullptr;
    const bool open = additional != nullptr ? !(additional->is_boolean() && !additional->get<bool>()) : declared.empty();
    if (open) {
      const std::string value = additional != nullptr ? visit(*additional, at + "/additionalProperties") : common("json-value");
      extra = rule(at + "-extra", other_key(declared) + " ws \":\" ws " + value + " ws");
    }
    // first(k): properties k.. with none written yet; after(k): with one written (commas first).
    // Declared order is kept; an optional property may be skipped.
    const std::string base = at.empty() ? "root-object" : at;
    std::vector<std::string> first(props.size() + 1), after(props.size() + 1);
    after[props.size()] = extra.empty() ? "\"\"" : "( \",\" ws " + extra + " )*";
    first[props.size()] = extra.empty() ? "\"\"" : "( " + extra + " ( \",\" ws " + extra + " )* )?";
    for (size_t k = props.size(); k-- > 0;) {
      const Property& p = props[k];
      const std::string kv = rule(base + "-kv", p.key + " ws \":\" ws " + p.value + " ws");
      const std::string a_next = rule(base + "-after", after[k + 1]);
      after[k] = p.required ? "\",\" ws " + kv + " " + a_next : "( \",\" ws " + kv + " )? " + a_next;
      const std::string f_next = rule(base + "-first", first[k + 1]);
      first[k] = p.required ? kv + " " + a_next : "( " + kv + " " + a_next + " | " + f_next + " )";
    }
    return "\"{\" ws " + first[0] + " \"}\"";
  }

  // A JSON string key (unescaped characters only) that is none of `names`: a trie over the names,
  // leaving it at any character no name continues with.
  std::string other_key(const std::set<std::string>& names) {
    common("json-char");
    if (names.empty()) return common("json-string");
    const std::string any = R"([^"\\\x00-\x1f]*)";
    // node(prefix): the rest of a key that starts with prefix (a prefix of some name).
    std::map<std::string, std::string> node;
    // Names with characters a key holds only escaped can never be written by the unescaped key
    // grammar, so they need no exclusion.
    std::set<std::string> plain;
    for (const std::string& n : names) {
      bool ok = true;
      for (size_t i = 0; i < n.size() && ok;) {
        uint32_t c = 0;
        const size_t len = decode_utf8(std::string_view(n).substr(i), c);
        ok = len > 0 && c >= 0x20 && c != '"' && c != '\\';
        i += len == 0 ? 1 : len;
      }
      if (ok) plain.insert(n);
    }
    std::function<std::string(const std::string&)> build = [&](const std::string& prefix) -> std::string {
      std::set<std::string> next;
      for (const std::string& n : plain) {
        if (n.size() > prefix.size() && n.compare(0, prefix.size(), prefix) == 0) {
          uint32_t c = 0;
          const size_t len = decode_utf8(std::string_view(n).substr(prefix.size()), c);
          if (len == 0) throw Error("json_schema: a property name is not valid UTF-8");
          next.insert(n.substr(prefix.size(), len));
        }
      }
      std::vector<std::string> alts;
      if (!plain.contains(prefix)) alts.push_back("\"\\\"\"");
      std::string excluded;
      for (const std::string& c : next) {
        alts.push_back(literal(c) + " " + build(prefix + c));
        uint32_t cp = 0;
        decode_utf8(c, cp);
        excluded += fmt::format("\\U{:08X}", cp);
      }
      alts.push_back("[^\"\\\\\\x00-\\x1f" + excluded + "] " + any + " \"\\\"\"");
      return rule("key", alternatives(alts));
    };
    return "\"\\\"\" " + build("");
  }

  std::string array(const json& s, const std::string& at) {
    const auto min = count(s, "minItems", at).value_or(0);
    const std::optional<uint64_t> max_items = count(s, "maxItems", at);
    std::vector<std::string> prefix;
    if (s.contains("prefixItems")) {
      if (!s["prefixItems"].is_array()) fail(at + "/prefixItems", "prefixItems must be an array of schemas");
      for (size_t i = 0; i < s["prefixItems"].size(); ++i) prefix.push_back(visit(s["prefixItems"][i], fmt::format("{}/prefixItems/{}", at, i)));
    }
    std::optional<std::string> item;  // nullopt: no items past the prefix
    if (!s.contains("items")) item = common("json-value");
    else if (!(s["items"].is_boolean() && !s["items"].get<bool>())) item = visit(s["items"], at + "/items");
    uint64_t max = max_items.value_or(UINT64_MAX);
    if (!item) max = std::min<uint64_t>(max, prefix.size());
    if (min > max) fail(at, "no array length satisfies minItems, maxItems and the items allowed");
    if (max == 0) return "\"[\" ws \"]\"";
    // Element i (i >= 1) written after the ones before it: the prefix's, then repetition of item.
    const auto element = [&](size_t i) { return i < prefix.size() ? prefix[i] : *item; };
    std::string tail;  // after the explicit elements: the first p (p = max(prefix size, 1)) up to max
    const size_t p = std::max<size_t>(prefix.size(), 1);
    const auto explicit_n = static_cast<size_t>(std::min<uint64_t>(p, max));
    if (p < max) {
      const uint64_t lo = min > p ? min - p : 0;
      const std::string rep = "( \",\" ws " + *item + " ws )";
      tail = max == UINT64_MAX ? (lo == 0 ? rep + "*" : fmt::format("{}{{{},}}", rep, lo))
                               : fmt::format("{}{{{},{}}}", rep, lo, max - p);
    }
    for (size_t i = explicit_n; i-- > 1;) {
      const std::string rest = "\",\" ws " + element(i) + " ws " + tail;
      tail = i >= min ? "( " + rest + " )?" : rest;
    }
    const std::string body = element(0) + " ws " + tail;
    return "\"[\" ws " + (min == 0 ? "( " + body + " )?" : body) + " \"]\"";
  }

  std::string reference(const json& s, const std::string& at) {
    for (const auto& [k, v] : s.items()) {
      if (k != "$ref" && !is_annotation(k)) fail(at, fmt::format("'{}' beside $ref is not supported", k));
    }
    if (!s["$ref"].is_string()) fail(at + "/$ref", "$ref must be a string");
    const std::string ref = s["$ref"].get<std::string>();
    if (const auto it = refs_.find(ref); it != refs_.end()) return it->second;
    std::string pointer;
    for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
      if (ref.rfind(prefix, 0) == 0) pointer = ref.substr(1);
    }
    if (ref == "#") pointer = "";
    else if (pointer.empty()) fail(at + "/$ref", fmt::format("$ref '{}' is not supported (only #, #/$defs/... and #/definitions/...)", ref));
    const json* target = nullptr;
    try {
      target = &root_.at(json::json_pointer(pointer));
    } catch (const std::exception&) {
      fail(at + "/$ref", fmt::format("$ref '{}' names nothing in the schema", ref));
    }
    // Named before it is converted, so that recursive references find it.
    const std::string name = fresh(ref.size() > 2 ? ref.substr(ref.rfind('/') + 1) : "root-ref");
    refs_[ref] = name;
    const size_t slot = rules_.size();
    rules_.emplace_back(name, "");
    const std::string body = visit(*target, pointer);
    rules_[slot].second = body;
    return name;
  }

  // allOf of object schemas (and the object's own keywords) as one object schema.
  json merge_all_of(const json& s, const std::string& at) {
    const json& parts = s["allOf"];
    if (!parts.is_array() || parts.empty()) fail(at + "/allOf", "allOf must be a non-empty array");
    json merged = s;
    merged.erase("allOf");
    std::vector<json> all = {merged};
    for (size_t i = 0; i < parts.size(); ++i) {
      json part = parts[i];
      for (int hops = 0; part.is_object() && part.contains("$ref"); ++hops) {
        const std::string where = fmt::format("{}/allOf/{}", at, i);
        if (hops > 32) fail(where, "$ref chain too long");
        for (const auto& [k, v] : part.items()) {
          if (k != "$ref" && !is_annotation(k)) fail(where, fmt::format("'{}' beside $ref is not supported", k));
        }
        if (!part["$ref"].is_string()) fail(where + "/$ref", "$ref must be a string");
        const std::string ref = part["$ref"].get<std::string>();
        if (ref.rfind("#/", 0) != 0) fail(fmt::format("{}/allOf/{}", at, i), "allOf: only local $ref are supported");
        try {
          part = root_.at(json::json_pointer(ref.substr(1)));
        } catch (const std::exception&) {
          fail(fmt::format("{}/allOf/{}", at, i), fmt::format("$ref '{}' names nothing in the schema", ref));
        }
      }
      all.push_back(part);
    }
    // additionalProperties false applies to its own schema's properties alone (JSON Schema has no
    // merging): a part that forbids others' properties makes the merge wrong, so it is refused.
    std::set<std::string> every;
    for (const json& part : all) {
      if (part.is_object() && part.contains("properties") && part["properties"].is_object()) {
        for (const auto& [name, sub] : part["properties"].items()) every.insert(name);
      }
    }
    for (size_t i = 0; i < all.size(); ++i) {
      const json& part = all[i];
      if (!part.is_object() || !part.contains("additionalProperties") || !part["additionalProperties"].is_boolean() ||
          part["additionalProperties"].get<bool>()) {
        continue;
      }
      for (const std::string& name : every) {
        if (!part.contains("properties") || !part["properties"].is_object() || !part["properties"].contains(name)) {
          fail(i == 0 ? at : fmt::format("{}/allOf/{}", at, i - 1),
               fmt::format("additionalProperties false here forbids '{}', a property of another allOf part (JSON "
                           "Schema applies it to this schema's own properties); not supported",
                           name));
        }
      }
    }
    json out = json::object();
    for (size_t i = 0; i < all.size(); ++i) {
      const json& part = all[i];
      if (!part.is_object()) fail(fmt::format("{}/allOf/{}", at, i), "allOf parts must be object schemas");
      for (const auto& [k, v] : part.items()) {
        if (is_annotation(k)) continue;
        if (k == "type") {
          if (v != "object") fail(fmt::format("{}/allOf/{}", at, i), "allOf is supported for object schemas only");
          out["type"] = "object";
        } else if (k == "properties") {
          for (const auto& [name, sub] : v.items()) {
            if (out["properties"].contains(name)) fail(fmt::format("{}/allOf/{}", at, i), fmt::format("property '{}' is defined twice in allOf", name));
            out["properties"][name] = sub;
          }
        } else if (k == "required") {
          for (const json& r : v) out["required"].push_back(r);
        } else if (k == "additionalProperties") {
          if (!(v.is_boolean() && !v.get<bool>())) fail(fmt::format("{}/allOf/{}", at, i), "allOf with additionalProperties other than false is not supported");
          out["additionalProperties"] = false;
        } else {
          fail(fmt::format("{}/allOf/{}", at, i), fmt::format("'{}' inside allOf is not supported (object parts only)", k));
        }
      }
    }
    out["type"] = "object";
    return out;
  }

  const json& root_;
  std::vector<std::pair<std::string, std::string>> rules_;
  // The shared rules' names are taken from the start, so that no $defs name becomes one of them.
  std::set<std::string> names_ = {"root",        "ws",          "json-char",  "json-string", "json-number",
                                  "json-integer", "json-value", "json-object", "json-array"};
  std::set<std::string> common_;
  std::map<std::string, std::string> refs_;
};

}  // namespace

std::string json_schema_to_gbnf(std::string_view schema) {
  json root;
  try {
    root = json::parse(schema);
  } catch (const json::parse_error& e) {
    throw Error(fmt::format("json_schema: not valid JSON: {}", e.what()));
  }
  return SchemaConverter(root).run();
}

Grammar json_schema_grammar(std::string_view schema) { return Grammar::parse(json_schema_to_gbnf(schema)); }

}  // namespace specula::grammar
