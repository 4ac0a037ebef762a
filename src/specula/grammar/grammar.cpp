// Grammar: the GBNF parser, the desugaring of groups and repetitions into rules, and the checks.
#include "specula/grammar/grammar.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "specula/core/error.h"
#include "specula/grammar/code_points.h"
#include "specula/grammar/utf8.h"

namespace specula::grammar {

bool Element::matches(uint32_t cp) const {
  // Ranges are sorted and disjoint: the first range ending at or after cp decides.
  const auto it = std::lower_bound(ranges.begin(), ranges.end(), cp,
                                   [](const std::pair<uint32_t, uint32_t>& r, uint32_t c) { return r.second < c; });
  return it != ranges.end() && it->first <= cp;
}

int Grammar::rule_index(std::string_view name) const {
  for (size_t i = 0; i < rules_.size(); ++i) {
    if (rules_[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

namespace {

// Sorted, merged ranges; `negate` takes the complement over [0, kMaxCodePoint].
std::vector<std::pair<uint32_t, uint32_t>> normalise(std::vector<std::pair<uint32_t, uint32_t>> r, bool negate) {
  return negate ? complement_ranges(r) : merge_ranges(std::move(r));
}

}  // namespace

class GrammarBuilder {
 public:
  GrammarBuilder(std::string_view text, const Limits& limits) : text_(text), limits_(limits) {}

  Grammar build() {
    skip_space(true);
    while (pos_ < text_.size()) {
      const size_t at = pos_;
      const std::string name = parse_name();
      if (name.empty()) fail(at, "expected a rule name");
      skip_space(false);
      if (text_.substr(pos_, 3) != "::=") fail(pos_, fmt::format("expected '::=' after rule name '{}'", name));
      pos_ += 3;
      const int r = rule(name);
      if (defined_[static_cast<size_t>(r)]) fail(at, fmt::format("rule '{}' is defined twice", name));
      defined_[static_cast<size_t>(r)] = true;
      g_.rules_[static_cast<size_t>(r)].alternatives = parse_alternatives(name, false);
      skip_space(true);
    }
    for (size_t i = 0; i < g_.rules_.size(); ++i) {
      if (!defined_[i]) fail(first_use_[i], fmt::format("rule '{}' is used but never defined", g_.rules_[i].name));
    }
    g_.root_ = g_.rule_index("root");
    SPECULA_CHECK(g_.root_ >= 0, "grammar: there is no rule 'root' (the start rule)");
    check_left_recursion();
    return std::move(g_);
  }

 private:
  [[noreturn]] void fail(size_t at, const std::string& what) const {
    int line = 1, col = 1;
    for (size_t i = 0; i < at && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    throw Error(fmt::format("grammar: line {}, column {}: {}", line, col, what));
  }

  // Spaces and comments; newlines too when `newlines`, or when the next line does not start a
  // new rule (a rule may continue on the following lines).
  void skip_space(bool newlines) {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c == '#') {
        while (pos_ < text_.size() && text_[pos_] != '\n') ++pos_;
      } else if (c == ' ' || c == '\t' || c == '\r') {
        ++pos_;
      } else if (c == '\n') {
        if (!newlines && starts_rule(pos_ + 1)) return;
        ++pos_;
      } else {
        return;
      }
    }
  }

  bool starts_rule(size_t at) const {
    size_t p = at;
    while (p < text_.size() && (text_[p] == ' ' || text_[p] == '\t' || text_[p] == '\r' || text_[p] == '\n')) ++p;
    const size_t start = p;
    while (p < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[p])) || text_[p] == '-' || text_[p] == '_')) ++p;
    if (p == start) return p >= text_.size();
    while (p < text_.size() && (text_[p] == ' ' || text_[p] == '\t')) ++p;
    return text_.substr(p, 3) == "::=";
  }

  std::string parse_name() {
    const size_t start = pos_;
    while (pos_ < text_.size() &&
           (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '-' || text_[pos_] == '_')) {
      ++pos_;
    }
    return std::string(text_.substr(start, pos_ - start));
  }

  int rule(const std::string& name) {
    const auto it = index_.find(name);
    if (it != index_.end()) return it->second;
    SPECULA_CHECK(static_cast<int>(g_.rules_.size()) < limits_.max_rules,
                  "grammar: more than {} rules (generated ones included); the limit is {}", limits_.max_rules,
                  limits_.max_rules);
    g_.rules_.push_back({name, {}});
    defined_.push_back(false);
    first_use_.push_back(pos_);
    const int r = static_cast<int>(g_.rules_.size()) - 1;
    index_[name] = r;
    return r;
  }

  // A fresh rule for a group or a repetition, named after the rule being parsed.
  int generated(const std::string& parent, std::vector<Sequence> alternatives) {
    const int r = rule(fmt::format("{}#{}", parent, ++generated_));
    defined_[static_cast<size_t>(r)] = true;
    g_.rules_[static_cast<size_t>(r)].alternatives = std::move(alternatives);
    return r;
  }

  static Element ref(int r) {
    Element e;
    e.kind = Element::Kind::kRule;
    e.rule = r;
    return e;
  }

  void count(size_t n) {
    elements_ += n;
    SPECULA_CHECK(elements_ <= static_cast<size_t>(limits_.max_elements),
                  "grammar: more than {} elements after expanding repetitions; the limit is {}", limits_.max_elements,
                  limits_.max_elements);
  }

  std::vector<Sequence> parse_alternatives(const std::string& parent, bool nested) {
    std::vector<Sequence> alts;
    alts.push_back(parse_sequence(parent, nested));
    while (pos_ < text_.size() && text_[pos_] == '|') {
      ++pos_;
      alts.push_back(parse_sequence(parent, nested));
    }
    return alts;
  }

  Sequence parse_sequence(const std::string& parent, bool nested) {
    Sequence seq;
    while (true) {
      skip_space(nested);
      if (pos_ >= text_.size()) break;
      const char c = text_[pos_];
      if (c == '|' || c == ')' || c == '\n') break;
      const size_t at = pos_;
      std::vector<Element> item = parse_item(parent);
      skip_space(nested);
      apply_postfix(parent, item, at);
      seq.insert(seq.end(), item.begin(), item.end());
    }
    count(seq.size());
    return seq;
  }

  // One element; a literal gives one element per code point.
  std::vector<Element> parse_item(const std::string& parent) {
    const size_t at = pos_;
    const char c = text_[pos_];
    if (c == '"') {
      ++pos_;
      std::vector<Element> out;
      while (true) {
        if (pos_ >= text_.size()) fail(at, "unterminated string literal");
        if (text_[pos_] == '"') break;
        const uint32_t cp = parse_char(at);
        Element e;
        e.ranges = {{cp, cp}};
        out.push_back(std::move(e));
      }
      ++pos_;
      return out;
    }
    if (c == '[') {
      ++pos_;
      const bool negate = pos_ < text_.size() && text_[pos_] == '^';
      if (negate) ++pos_;
      std::vector<std::pair<uint32_t, uint32_t>> ranges;
      while (true) {
        if (pos_ >= text_.size()) fail(at, "unterminated character class");
        if (text_[pos_] == ']') break;
        const uint32_t lo = parse_char(at);
        uint32_t hi = lo;
        if (pos_ + 1 < text_.size() && text_[pos_] == '-' && text_[pos_ + 1] != ']') {
          ++pos_;
          hi = parse_char(at);
          if (hi < lo) fail(at, fmt::format("character range U+{:04X}-U+{:04X} is reversed", lo, hi));
        }
        ranges.emplace_back(lo, hi);
      }
      ++pos_;
      Element e;
      e.ranges = normalise(std::move(ranges), negate);
      if (e.ranges.empty()) fail(at, "character class matches nothing");
      return {std::move(e)};
    }
    if (c == '.') {
      ++pos_;
      Element e;
      e.ranges = {{0, kMaxCodePoint}};
      return {std::move(e)};
    }
    if (c == '(') {
      ++pos_;
      std::vector<Sequence> alts = parse_alternatives(parent, true);
      skip_space(true);
      if (pos_ >= text_.size() || text_[pos_] != ')') fail(at, "unclosed '('");
      ++pos_;
      return {ref(generated(parent, std::move(alts)))};
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      const std::string name = parse_name();
      return {ref(rule(name))};
    }
    fail(at, fmt::format("unexpected '{}'", c));
  }

  // A code point of a literal or class: UTF-8 text or an escape.
  uint32_t parse_char(size_t item) {
    if (text_[pos_] != '\\') {
      uint32_t cp = 0;
      const size_t n = decode_utf8(text_.substr(pos_), cp);
      if (n == 0) fail(pos_, "invalid UTF-8 in the grammar text");
      pos_ += n;
      return cp;
    }
    const size_t at = pos_;
    if (pos_ + 1 >= text_.size()) fail(item, "unterminated escape");
    const char e = text_[pos_ + 1];
    pos_ += 2;
    switch (e) {
      case 'n': return '\n';
      case 'r': return '\r';
      case 't': return '\t';
      case '\\': return '\\';
      case '"': return '"';
      case '[': return '[';
      case ']': return ']';
      case '-': return '-';
      case '^': return '^';
      case 'x': return parse_hex(at, 2);
      case 'u': return parse_hex(at, 4);
      case 'U': return parse_hex(at, 8);
      default: fail(at, fmt::format("unknown escape '\\{}'; supported: \\n \\r \\t \\\\ \\\" \\[ \\] \\- \\^ \\xHH \\uHHHH \\UHHHHHHHH", e));
    }
  }

  uint32_t parse_hex(size_t at, int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      if (pos_ >= text_.size() || !std::isxdigit(static_cast<unsigned char>(text_[pos_]))) {
        fail(at, fmt::format("escape needs {} hex digits", digits));
      }
      const char h = text_[pos_++];
      v = v * 16 + hex_digit(h);
    }
    if (v > kMaxCodePoint) fail(at, fmt::format("U+{:X} is past the last code point U+10FFFF", v));
    return v;
  }

  int parse_count(size_t at) {
    const size_t start = pos_;
    while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) ++pos_;
    if (pos_ == start) fail(at, "expected a number in '{m,n}'");
    const std::string digits(text_.substr(start, pos_ - start));
    if (digits.size() > 6 || std::stoi(digits) > limits_.max_repeat) {
      fail(at, fmt::format("repetition count {} exceeds the limit {}", digits, limits_.max_repeat));
    }
    return std::stoi(digits);
  }

  // Postfix * + ? {m} {m,} {m,n} on `item` (a literal's code points repeat as one group).
  void apply_postfix(const std::string& parent, std::vector<Element>& item, size_t at) {
    if (pos_ >= text_.size()) return;
    const char c = text_[pos_];
    if (c != '*' && c != '+' && c != '?' && c != '{') return;
    ++pos_;
    int lo = 0, hi = -1;  // hi -1: unbounded
    if (c == '+') lo = 1;
    if (c == '?') hi = 1;
    if (c == '{') {
      skip_space(true);
      lo = parse_count(at);
      skip_space(true);
      hi = lo;
      if (pos_ < text_.size() && text_[pos_] == ',') {
        ++pos_;
        skip_space(true);
        hi = pos_ < text_.size() && text_[pos_] == '}' ? -1 : parse_count(at);
      }
      skip_space(true);
      if (pos_ >= text_.size() || text_[pos_] != '}') fail(at, "expected '}' to close '{m,n}'");
      ++pos_;
      if (hi >= 0 && hi < lo) fail(at, fmt::format("repetition {{{},{}}} has n < m", lo, hi));
    }
    skip_space(false);
    const Sequence unit(item.begin(), item.end());
    std::vector<Element> out;
    for (int i = 0; i < lo; ++i) out.insert(out.end(), unit.begin(), unit.end());
    count(out.size());
    if (hi < 0) {
      // x* ::= x x* | ε
      const int star = rule(fmt::format("{}#{}", parent, ++generated_));
      defined_[static_cast<size_t>(star)] = true;
      Sequence again = unit;
      again.push_back(ref(star));
      g_.rules_[static_cast<size_t>(star)].alternatives = {again, {}};
      out.push_back(ref(star));
    } else if (hi > lo) {
      // Up to hi - lo more, nested: opt_k ::= x opt_{k-1} | ε, opt_1 ::= x | ε.
      int inner = -1;
      for (int k = 1; k <= hi - lo; ++k) {
        Sequence more = unit;
        if (inner >= 0) more.push_back(ref(inner));
        inner = generated(parent, {more, {}});
        count(more.size());
      }
      out.push_back(ref(inner));
    }
    item = std::move(out);
  }

  // A rule that can reach itself without consuming input and with something left to match after
  // the reference makes the automaton's stacks grow forever. (Through references at the end of
  // their alternatives only, as repetition of a part that may be empty does, it cannot: the
  // automaton drops finished positions before it descends.)
  void check_left_recursion() const {
    const auto& rules = g_.rules_;
    std::vector<bool> nullable(rules.size(), false);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < rules.size(); ++r) {
        if (nullable[r]) continue;
        for (const Sequence& s : rules[r].alternatives) {
          const bool all = std::all_of(s.begin(), s.end(), [&](const Element& e) {
            return e.kind == Element::Kind::kRule && nullable[static_cast<size_t>(e.rule)];
          });
          if (all) {
            nullable[r] = true;
            changed = true;
            break;
          }
        }
      }
    }
    // Edges to the rules an alternative can start with; `tail` when nothing follows the reference.
    struct Edge {
      int to;
      bool tail;
    };
    std::vector<std::vector<Edge>> first(rules.size());
    for (size_t r = 0; r < rules.size(); ++r) {
      for (const Sequence& s : rules[r].alternatives) {
        for (size_t i = 0; i < s.size(); ++i) {
          const Element& e = s[i];
          if (e.kind != Element::Kind::kRule) break;
          first[r].push_back({e.rule, i + 1 == s.size()});
          if (!nullable[static_cast<size_t>(e.rule)]) break;
        }
      }
    }
    // A cycle through a non-tail edge u -> v: u reachable from v.
    std::vector<int> mark(rules.size(), -1);
    for (size_t u = 0; u < rules.size(); ++u) {
      for (const Edge& edge : first[u]) {
        if (edge.tail) continue;
        std::vector<int> todo = {edge.to};
        const int pass = static_cast<int>(u);
        while (!todo.empty()) {
          const int x = todo.back();
          todo.pop_back();
          if (x == pass) {
            throw Error(fmt::format("grammar: rule '{}' is left-recursive (it can reach itself without consuming "
                                    "input); rewrite it with repetition",
                                    rules[u].name));
          }
          if (mark[static_cast<size_t>(x)] == pass) continue;
          mark[static_cast<size_t>(x)] = pass;
          for (const Edge& f : first[static_cast<size_t>(x)]) todo.push_back(f.to);
        }
      }
    }
  }

  std::string_view text_;
  Limits limits_;
  size_t pos_ = 0;
  Grammar g_;
  std::map<std::string, int> index_;
  std::vector<bool> defined_;
  std::vector<size_t> first_use_;
  int generated_ = 0;
  size_t elements_ = 0;
};

Grammar Grammar::parse(std::string_view text, const Limits& limits) { return GrammarBuilder(text, limits).build(); }

}  // namespace specula::grammar
