// Tests of specula::jinja: one group per language feature with exact expected output (what
// Python's jinja2 renders under transformers' settings), error cases and resource bounds, and
// the real chat templates of tests/data/chat_templates/ rendered byte for byte against goldens
// from @huggingface/jinja (tools/chat_template_goldens/).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "specula/core/error.h"
#include "specula/jinja/template.h"

namespace specula::jinja {
namespace {

using json = nlohmann::ordered_json;

// 2025-03-14 09:26:53, a Friday: the date the goldens were made with.
std::tm fixed_now() {
  std::tm t{};
  t.tm_year = 2025 - 1900;
  t.tm_mon = 2;
  t.tm_mday = 14;
  t.tm_hour = 9;
  t.tm_min = 26;
  t.tm_sec = 53;
  t.tm_wday = 5;
  t.tm_yday = 72;
  return t;
}

RenderOptions test_options() {
  RenderOptions options;
  options.now = fixed_now;
  return options;
}

std::string render(std::string_view source, const json& context = json::object(),
                   const RenderOptions& options = test_options()) {
  return Template::parse(source).render(context, options);
}

// The message of the specula::Error that parsing or rendering throws ("" if none).
std::string error_of(std::string_view source, const json& context = json::object(),
                     const RenderOptions& options = test_options()) {
  try {
    render(source, context, options);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_ERROR_CONTAINS(message, fragment) \
  EXPECT_NE(std::string(message).find(fragment), std::string::npos) << "error was: " << (message)

// ---- whitespace control (trim_blocks and lstrip_blocks are on, as in transformers) ----

TEST(JinjaWhitespace, TrimBlocksEatsOneNewlineAfterBlockTags) {
  EXPECT_EQ(render("{% if true %}\nyes\n{% endif %}\nafter"), "yes\nafter");
  EXPECT_EQ(render("{% if true %}\n\nx{% endif %}"), "\nx");
  EXPECT_EQ(render("{{ 'a' }}\nb"), "a\nb");  // not after {{ }}
  EXPECT_EQ(render("{# note #}\nx"), "x");     // comments count as blocks
}

TEST(JinjaWhitespace, LstripBlocksRemovesIndentBeforeBlockTags) {
  EXPECT_EQ(render("  {% if true %}\n  x\n  {% endif %}\n"), "  x\n");
  EXPECT_EQ(render("a  {% if true %}b{% endif %}"), "a  b");  // not at a line start
  EXPECT_EQ(render("  {{ 'v' }}"), "  v");                    // not before {{
  EXPECT_EQ(render("\t {# c #}\nx"), "x");
  // trim_blocks ate the newline, yet the next line's indentation still counts as a line start.
  EXPECT_EQ(render("{% if true %}\n    {% if true %}x{% endif %}\n{% endif %}"), "x");
}

TEST(JinjaWhitespace, MinusStripsAllWhitespaceAndPlusKeepsIt) {
  EXPECT_EQ(render("a  \n {%- if true -%} \n b \n {%- endif -%}  c"), "abc");
  EXPECT_EQ(render("a \n {{- 'x' -}} \n b"), "axb");
  EXPECT_EQ(render("a {#- c -#} b"), "ab");
  EXPECT_EQ(render("  {%+ if true %}x{% endif %}"), "  x");
  EXPECT_EQ(render("{% if true +%}\nx{% endif %}"), "\nx");
  // Python's str.isspace: the ideographic space is whitespace too.
  EXPECT_EQ(render("a\u3000 {{- 'b' }}"), "ab");
}

TEST(JinjaWhitespace, NewlinesAreNormalisedAndOneTrailingNewlineDropped) {
  EXPECT_EQ(render("x\n"), "x");
  EXPECT_EQ(render("x\n\n"), "x\n");
  EXPECT_EQ(render("a\r\nb\rc"), "a\nb\nc");
  EXPECT_EQ(render("{{ s }}", {{"s", "a\r\nb\n"}}), "a\r\nb\n");  // values are not touched
}

TEST(JinjaWhitespace, CommentsAndRaw) {
  EXPECT_EQ(render("a{# {{ x }} {% if %} #}b"), "ab");
  EXPECT_EQ(render("{% raw %}{{ x }}{% if %}{% endraw %}!"), "{{ x }}{% if %}!");
}

// ---- expressions ----

TEST(JinjaExpressions, LiteralsPrintLikePython) {
  EXPECT_EQ(render("{{ 1 }}|{{ -2 }}|{{ 1.5 }}|{{ 1.0 }}|{{ 'a' }}|{{ \"b\" }}|{{ true }}|{{ False }}|{{ none }}"),
            "1|-2|1.5|1.0|a|b|True|False|None");
  EXPECT_EQ(render("{{ [1, 'a', none, true] }}|{{ {'k': 'v', 'n': [1.5]} }}|{{ (1,) }}|{{ (1, 2) }}|{{ [] }}"),
            "[1, 'a', None, True]|{'k': 'v', 'n': [1.5]}|(1,)|(1, 2)|[]");
  EXPECT_EQ(render("{{ 1_000 }}|{{ 0x1F }}|{{ 1e3 }}|{{ 2.5E-3 }}|{{ 'a' 'b' }}"), "1000|31|1000.0|0.0025|ab");
  EXPECT_EQ(render("{{ [\"it's\", 'say \"x\"', 'both \\' \"'] }}"),
            "[\"it's\", 'say \"x\"', 'both \\' \"']");
}

TEST(JinjaExpressions, StringEscapes) {
  EXPECT_EQ(render(R"({{ 'a\nb\t\\c\'d\"e' }})"), "a\nb\t\\c'd\"e");
  EXPECT_EQ(render(R"({{ '\x41\u00e9\U0001F642\101' }})"), "A\u00e9\U0001F642A");
  EXPECT_EQ(render(R"({{ '\d' }})"), "\\d");  // unknown escapes keep the backslash
  EXPECT_EQ(render(R"({{ ['a\nb'] }})"), R"(['a\nb'])");
}

TEST(JinjaExpressions, FloatsUsePythonRepr) {
  EXPECT_EQ(render("{{ 0.1 + 0.2 }}|{{ 1e16 }}|{{ 1e15 }}|{{ 1e-5 }}|{{ 0.0001 }}|{{ 123456789012345678.0 }}"),
            "0.30000000000000004|1e+16|1000000000000000.0|1e-05|0.0001|1.2345678901234568e+17");
  EXPECT_EQ(render("{{ x }}|{{ -0.0 }}", {{"x", 2.0}}), "2.0|-0.0");
}

TEST(JinjaExpressions, Arithmetic) {
  EXPECT_EQ(render("{{ 1 + 2 * 3 }}|{{ (1 + 2) * 3 }}|{{ 10 / 4 }}|{{ 4 / 2 }}|{{ 7 // 2 }}|{{ -7 // 2 }}"),
            "7|9|2.5|2.0|3|-4");
  EXPECT_EQ(render("{{ -7 % 3 }}|{{ 7 % -3 }}|{{ 2 ** 10 }}|{{ 2 ** -1 }}|{{ 7.5 // 2 }}|{{ 1 + 0.5 }}|{{ true + 1 }}"),
            "2|-2|1024|0.5|3.0|1.5|2");
  EXPECT_EQ(render("{{ 'ab' * 3 }}|{{ 2 * [0] }}|{{ [1] + [2] }}|{{ 'a' + 'b' }}|{{ -(3) }}|{{ +4 }}"),
            "ababab|[0, 0]|[1, 2]|ab|-3|4");
  EXPECT_EQ(render("{{ 'a' ~ 1 ~ none ~ 1.0 ~ missing ~ [1] }}"), "a1None1.0[1]");
}

TEST(JinjaExpressions, PrecedenceFollowsJinja2) {
  // Filters bind tighter than binary operators; unary minus applies before the filter.
  // ~ binds tighter than + and -, looser than * and /.
  EXPECT_EQ(render("{{ 'a' + ' b ' | trim + 'c' }}|{{ -3 | abs }}|{{ 'x' + 1 ~ 2 }}|{{ 2 * 3 ~ 4 }}"), "abc|3|x12|64");
  EXPECT_EQ(render("{{ not 1 == 2 }}|{{ 1 if false else 2 if true else 3 }}|{{ 1 < 2 < 3 }}|{{ 3 > 2 > 2 }}"),
            "True|2|True|False");
}

TEST(JinjaExpressions, ComparisonsAndMembership) {
  EXPECT_EQ(render("{{ 1 == 1.0 }}{{ 1 == true }}{{ 'a' == 'a' }}{{ [1, 2] == [1, 2] }}{{ 'a' != 1 }}{{ none == none }}"),
            "TrueTrueTrueTrueTrueTrue");
  EXPECT_EQ(render("{{ 'b' > 'a' }}{{ [1, 2] < [1, 3] }}{{ 2 >= 2 }}{{ 'at' in 'cat' }}{{ 2 not in [1, 3] }}"
                   "{{ 'k' in {'k': 1} }}{{ 'x' in missing }}"),
            "TrueTrueTrueTrueTrueTrueFalse");
  EXPECT_EQ(render("{{ a == b }}", {{"a", {{"x", 1}, {"y", 2}}}, {"b", {{"y", 2}, {"x", 1}}}}), "True");
}

TEST(JinjaExpressions, AndOrReturnOperands) {
  EXPECT_EQ(render("{{ none or 'd' }}|{{ 0 and 'x' }}|{{ 'a' and 'b' }}|{{ not '' }}|{{ [] or [1] }}"),
            "d|0|b|True|[1]");
  EXPECT_EQ(render("{{ 'y' if 1 else 'n' }}|{{ 'y' if 0 }}|"), "y||");
}

TEST(JinjaExpressions, AttributesSubscriptsAndSlices) {
  const json ctx = {{"d", {{"a", 1}, {"b", {{"c", "deep"}}}}},
                    {"l", {10, 20, 30, 40}},
                    {"s", "h\u00e9llo w\u00f6rld"}};
  EXPECT_EQ(render("{{ d.a }}|{{ d['a'] }}|{{ d.b.c }}|{{ d['b']['c'] }}|{{ l[0] }}|{{ l[-1] }}|{{ l.1 }}", ctx),
            "1|1|deep|deep|10|40|20");
  EXPECT_EQ(render("{{ l[1:] }}|{{ l[:-1] }}|{{ l[::-1] }}|{{ l[::2] }}|{{ l[1:3] }}|{{ l[5:] }}|{{ l[-2:] }}", ctx),
            "[20, 30, 40]|[10, 20, 30]|[40, 30, 20, 10]|[10, 30]|[20, 30]|[]|[30, 40]");
  // Strings index by code point, as Python does.
  EXPECT_EQ(render("{{ s[1] }}|{{ s[1:4] }}|{{ s[::-1] }}|{{ s[-5:] }}|{{ s | length }}", ctx),
            "\u00e9|\u00e9ll|dlr\u00f6w oll\u00e9h|w\u00f6rld|11");
  EXPECT_EQ(render("[{{ l[10] }}][{{ d.zzz }}][{{ d['zzz'] }}]", ctx), "[][][]");
}

TEST(JinjaExpressions, UndefinedIsEmptyAndFalsy) {
  EXPECT_EQ(render("[{{ missing }}][{{ missing.attr }}][{{ missing['k'].x }}]"), "[][][]");
  EXPECT_EQ(render("{% if missing %}y{% else %}n{% endif %}{{ missing is defined }}{{ missing is undefined }}"),
            "nFalseTrue");
  EXPECT_EQ(render("{{ d.x is defined }}{{ missing | length }}{% for x in missing %}x{% endfor %}", {{"d", json::object()}}),
            "False0");
  EXPECT_EQ(render("{{ missing | default('d') }}|{{ none | default('d') }}|{{ '' | default('d', true) }}|{{ x | d('y') }}",
                   {{"x", "set"}}),
            "d|None|d|set");
}

TEST(JinjaExpressions, ContextKeyOrderIsKept) {
  const json ctx = json::parse(R"({"d": {"zeta": 1, "alpha": 2, "mid": 3}})");
  EXPECT_EQ(render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", ctx), "zeta=1;alpha=2;mid=3;");
  EXPECT_EQ(render("{{ d }}|{{ d | tojson }}", ctx), "{'zeta': 1, 'alpha': 2, 'mid': 3}|{\"zeta\": 1, \"alpha\": 2, \"mid\": 3}");
}

TEST(JinjaExpressions, DictMethods) {
  const json ctx = json::parse(R"({"d": {"a": 1, "b": null, "items": "shadowed"}})");
  EXPECT_EQ(render("{{ d.keys() | list }}|{{ d.values() | list }}|{{ d.get('a') }}|{{ d.get('x') }}|{{ d.get('x', 5) }}", ctx),
            "['a', 'b', 'items']|[1, None, 'shadowed']|1|None|5");
  // obj.name prefers the dict method, obj['name'] the key (jinja2's getattr vs getitem).
  EXPECT_EQ(render("{{ d['items'] }}|{{ d.items() | length }}", ctx), "shadowed|3");
}

TEST(JinjaExpressions, StringMethods) {
  const json ctx = {{"s", "  <think>\nplan\n</think>\n\nanswer  "}};
  EXPECT_EQ(render("[{{ s.strip() }}]", ctx), "[<think>\nplan\n</think>\n\nanswer]");
  EXPECT_EQ(render("[{{ s.split('</think>')[-1].lstrip('\\n').rstrip() }}]", ctx), "[answer]");
  EXPECT_EQ(render("[{{ s.split('</think>')[0].strip().split('<think>')[-1].strip('\\n') }}]", ctx), "[plan]");
  EXPECT_EQ(render("{{ ' a  b\tc '.split() }}|{{ 'a,b,,c'.split(',') }}|{{ 'a,b,c'.split(',', 1) }}|{{ 'a,b,c'.rsplit(',', 1) }}"),
            "['a', 'b', 'c']|['a', 'b', '', 'c']|['a', 'b,c']|['a,b', 'c']");
  EXPECT_EQ(render("{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith('bc') }}{{ 'abc'.startswith(('x', 'a')) }}{{ 'abc'.endswith('x') }}"),
            "TrueTrueTrueFalse");
  EXPECT_EQ(render("{{ 'MiXed'.upper() }}|{{ 'MiXed'.lower() }}|{{ 'hello wORLD'.title() }}|{{ 'hello World'.capitalize() }}"),
            "MIXED|mixed|Hello World|Hello world");
  EXPECT_EQ(render("{{ 'a-b-c'.replace('-', '+') }}|{{ 'a-b-c'.replace('-', '', 1) }}|{{ '{} and {name}!'.format(1, name='x') }}"),
            "a+b+c|ab-c|1 and x!");
  EXPECT_EQ(render("{{ ', '.join(['a', 'b']) }}|{{ 'hello'.find('l') }}|{{ 'hello'.count('l') }}|{{ 'x'.zfill is defined }}"),
            "a, b|2|2|False");
}

// ---- statements ----

TEST(JinjaStatements, IfElifElse) {
  const std::string t = "{% if n > 2 %}big{% elif n == 2 %}two{% else %}small{% endif %}";
  EXPECT_EQ(render(t, {{"n", 3}}), "big");
  EXPECT_EQ(render(t, {{"n", 2}}), "two");
  EXPECT_EQ(render(t, {{"n", 1}}), "small");
}

TEST(JinjaStatements, ForLoopVariables) {
  EXPECT_EQ(render("{% for x in ['a', 'b', 'c'] %}{{ x }}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}"
                   "{{ loop.last }}{{ loop.length }}{{ loop.revindex }}{{ loop.revindex0 }}|{% endfor %}"),
            "a10TrueFalse332|b21FalseFalse321|c32FalseTrue310|");
  EXPECT_EQ(render("{% for x in [1, 2, 3] %}{{ loop.previtem }}-{{ loop.nextitem }}/{{ loop.cycle('o', 'e') }} {% endfor %}"),
            "-2/o 1-3/e 2-/o ");
  EXPECT_EQ(render("{% for x in [] %}x{% else %}empty{% endfor %}{% for c in 'h\u00e9' %}[{{ c }}]{% endfor %}"),
            "empty[h][\u00e9]");
}

TEST(JinjaStatements, ForLoopUnpackingAndInlineFilter) {
  const json ctx = json::parse(R"({"d": {"name": "f", "return": "x", "args": [1]}})");
  EXPECT_EQ(render("{% for k, v in d.items() if k != 'return' %}{{ k }}={{ v }}{{ ',' if not loop.last }}{% endfor %}", ctx),
            "name=f,args=[1]");
  EXPECT_EQ(render("{% for x in [1, 2, 3, 4, 5] if x is odd %}{{ x }}/{{ loop.length }} {% endfor %}"), "1/3 3/3 5/3 ");
  EXPECT_EQ(render("{% for a, b in [[1, 2], (3, 4), 'xy'] %}{{ a }}{{ b }}{% endfor %}"), "1234xy");
  EXPECT_EQ(render("{% for k in {'b': 1, 'a': 2} %}{{ k }}{% endfor %}"), "ba");
}

TEST(JinjaStatements, BreakAndContinue) {
  EXPECT_EQ(render("{% for i in range(10) %}{% if i == 4 %}{% break %}{% endif %}{% if i is odd %}{% continue %}{% endif %}"
                   "{{ i }}{% endfor %}"),
            "02");
}

TEST(JinjaStatements, SetScopingMatchesJinja2) {
  // A loop body cannot rebind an outer name; namespace() is the way out.
  EXPECT_EQ(render("{% set x = 1 %}{% for i in [1, 2] %}{% set x = i %}{{ x }}{% endfor %}{{ x }}"), "121");
  EXPECT_EQ(render("{% set ns = namespace(x=1, s='') %}{% for i in [1, 2] %}{% set ns.x = ns.x + i %}"
                   "{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.x }}{{ ns.s }}"),
            "412");
  EXPECT_EQ(render("{% if true %}{% set y = 5 %}{% endif %}{{ y }}"), "5");  // if shares its scope
  EXPECT_EQ(render("{% for i in [1, 2] %}{% if i == 1 %}{% set z = 'one' %}{% endif %}[{{ z }}]{% endfor %}"),
            "[one][]");  // every iteration starts afresh
  EXPECT_EQ(render("{% set messages = messages[1:] %}{{ messages | length }}", {{"messages", {1, 2, 3}}}), "2");
  EXPECT_EQ(render("{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c = 3, %}{{ c }}"), "12(3,)");
  EXPECT_EQ(render("{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}{{ ns.c is defined }}"), "12False");
}

TEST(JinjaStatements, BlockSet) {
  EXPECT_EQ(render("{% set b %}hi {{ 1 + 1 }}{% endset %}[{{ b }}]"), "[hi 2]");
  EXPECT_EQ(render("{% set b | upper | trim %}  x  {% endset %}[{{ b }}]"), "[X]");
  EXPECT_EQ(render("{% set ns = namespace() %}{% set ns.v %}in{% endset %}{{ ns.v }}"), "in");
}

TEST(JinjaStatements, MacrosWithDefaultsKeywordsAndRecursion) {
  EXPECT_EQ(render("{% macro greet(name, greeting='Hello', end=greeting ~ '!') %}{{ greeting }}, {{ name }}{{ end }}"
                   "{% endmacro %}{{ greet('Ann') }} {{ greet('Bob', greeting='Hi') }} {{ greet(name='Cy', end='.') }}"),
            "Hello, AnnHello! Hi, BobHi! Hello, Cy.");
  EXPECT_EQ(render("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(3) }}"), "321");
  EXPECT_EQ(render("{% macro m(a) %}[{{ a }}]{% endmacro %}{{ m() }}{{ m(1) | length }}"), "[]3");
  // Macros see template-level variables at call time.
  EXPECT_EQ(render("{% macro show() %}{{ v }}{% endmacro %}{% set v = 'late' %}{{ show() }}"), "late");
}

TEST(JinjaStatements, CallFilterWithAndGenerationBlocks) {
  EXPECT_EQ(render("{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}in{% endcall %}"),
            "<b>in</b>");
  EXPECT_EQ(render("{% macro each(xs) %}{% for x in xs %}{{ caller(x) }}{% endfor %}{% endmacro %}"
                   "{% call(x) each([1, 2]) %}({{ x }}){% endcall %}"),
            "(1)(2)");
  EXPECT_EQ(render("{% filter upper %}abc{{ 'd' }}{% endfilter %}|{% filter replace('a', 'b') | upper %}aa{% endfilter %}"),
            "ABCD|BB");
  EXPECT_EQ(render("{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}]"), "3[]");
  EXPECT_EQ(render("{%- generation -%} x {%- endgeneration -%}"), "x");
}

// ---- filters ----

TEST(JinjaFilters, TojsonMatchesTransformers) {
  const json ctx = json::parse(R"({"v": {"s": "é <b>&'\"\\\n\t\u0001", "n": [1, 2.5, true, null], "e": {}, "l": []}})");
  EXPECT_EQ(render("{{ v | tojson }}", ctx),
            R"({"s": "é <b>&'\"\\\n\t\u0001", "n": [1, 2.5, true, null], "e": {}, "l": []})");
  EXPECT_EQ(render("{{ v.n | tojson(indent=2) }}", ctx), "[\n  1,\n  2.5,\n  true,\n  null\n]");
  EXPECT_EQ(render("{{ {'a': {'b': [1]}} | tojson(indent=4) }}"),
            "{\n    \"a\": {\n        \"b\": [\n            1\n        ]\n    }\n}");
  EXPECT_EQ(render("{{ {'b': 1, 'a': 'é'} | tojson(sort_keys=true, ensure_ascii=true, separators=(',', ':')) }}"),
            R"({"a":"\u00e9","b":1})");
  EXPECT_EQ(render("{{ 'x' | tojson }}|{{ 3 | tojson }}|{{ 2.0 | tojson }}|{{ '🙂' | tojson(true) }}"),
            "\"x\"|3|2.0|\"\\ud83d\\ude42\"");
}

TEST(JinjaFilters, StringFilters) {
  EXPECT_EQ(render("[{{ '  a b \n' | trim }}][{{ 'xxaxx' | trim('x') }}][{{ 'hello WORLD-wide (big)' | title }}]"),
            "[a b][a][Hello World-Wide (Big)]");
  EXPECT_EQ(render("{{ 'aBc' | upper }}{{ 'aBc' | lower }}{{ 'aBC dE' | capitalize }}{{ 'a.b.c' | replace('.', '/') }}"),
            "ABCabcAbc dea/b/c");
  EXPECT_EQ(render("{{ 'a\nb\n\nc' | indent(2) }}|{{ 'a\nb' | indent(2, first=true) }}|{{ 'a\n\nb' | indent('> ', blank=true) }}"),
            "a\n  b\n\n  c|  a\n  b|a\n> \n> b");
  EXPECT_EQ(render("{{ '<a href=\"x\">&\\'' | e }}|{{ '<b>' | escape }}|{{ '<b>' | safe }}"),
            "&lt;a href=&#34;x&#34;&gt;&amp;&#39;|&lt;b&gt;|<b>");
  EXPECT_EQ(render("{{ 'héllo' | length }}{{ 'abc' | count }}{{ 'abc' | reverse }}{{ 'a b c' | wordcount }}{{ 42 | string }}"),
            "53cba342");
}

TEST(JinjaFilters, NumberFilters) {
  EXPECT_EQ(render("{{ '42' | int }}|{{ '3.7' | int }}|{{ 'x' | int }}|{{ 'x' | int(7) }}|{{ '0x1A' | int(0, 16) }}|{{ 4.9 | int }}"),
            "42|3|0|7|26|4");
  EXPECT_EQ(render("{{ '2.5' | float }}|{{ 'x' | float }}|{{ 3 | float }}|{{ -3 | abs }}|{{ -2.5 | abs }}"),
            "2.5|0.0|3.0|3|2.5");
  // Python's round: ties to even, a float unless the input is an int.
  EXPECT_EQ(render("{{ 2.5 | round }}|{{ 3.5 | round }}|{{ 2.675 | round(2) }}|{{ 1.234 | round(1, 'ceil') }}|"
                   "{{ 1.99 | round(1, 'floor') }}|{{ 7 | round }}"),
            "2.0|4.0|2.67|1.3|1.9|7");
}

TEST(JinjaFilters, SequenceFilters) {
  EXPECT_EQ(render("{{ [3, 1, 2] | first }}{{ [3, 1, 2] | last }}{{ [3, 1, 2] | length }}{{ [] | first is defined }}"),
            "323False");
  EXPECT_EQ(render("{{ [1, 2] | join(', ') }}|{{ ['a', 'b'] | join }}|{{ 'ab' | list }}|{{ {'k': 1} | list }}"),
            "1, 2|ab|['a', 'b']|['k']");
  EXPECT_EQ(render("{{ ['b', 'A', 'a', 'c', 'B'] | unique | list }}|{{ [3, 1, 2] | sort }}|{{ [3, 1, 2] | sort(reverse=true) }}"),
            "['b', 'A', 'c']|[1, 2, 3]|[3, 2, 1]");
  EXPECT_EQ(render("{{ [1, 2, 3] | reverse | list }}|{{ [1, 5, 3] | max }}|{{ [4, 2, 8] | min }}|{{ [1, 2, 3] | sum }}"),
            "[3, 2, 1]|5|2|6");
  EXPECT_EQ(render("{{ {'b': 1, 'a': 2} | dictsort }}|{{ {'b': 1, 'a': 2} | items | list }}|{{ {'x': 1} | keys }}|{{ {'x': 1} | values }}"),
            "[('a', 2), ('b', 1)]|[('b', 1), ('a', 2)]|['x']|[1]");
}

TEST(JinjaFilters, MapSelectReject) {
  const json ctx = json::parse(R"({"ms": [{"role": "system", "content": "s"}, {"role": "user", "content": "u1"},
                                         {"role": "assistant", "content": "a", "tool_calls": [1]},
                                         {"role": "user", "content": "u2"}]})");
  EXPECT_EQ(render("{{ ms | map(attribute='role') | join(',') }}", ctx), "system,user,assistant,user");
  EXPECT_EQ(render("{{ ms | selectattr('role', 'equalto', 'user') | map(attribute='content') | list }}", ctx),
            "['u1', 'u2']");
  EXPECT_EQ(render("{{ ms | rejectattr('role', 'eq', 'user') | list | length }}|{{ ms | selectattr('tool_calls') | list | length }}"
                   "|{{ ms | selectattr('tool_calls', 'undefined') | list | length }}",
                   ctx),
            "2|1|3");
  EXPECT_EQ(render("{{ [1, 2, 3, 4] | select('even') | list }}|{{ [1, 2, 3, 4] | reject('odd') | list }}|"
                   "{{ [0, 1, '', 'a'] | select | list }}|{{ ['a', 'b'] | map('upper') | list }}|"
                   "{{ [1, 5, 9] | select('gt', 4) | list }}",
                   ctx),
            "[2, 4]|[2, 4]|[1, 'a']|['A', 'B']|[5, 9]");
  EXPECT_EQ(render("{{ ms | map(attribute='missing', default='-') | join }}", ctx), "----");
}

TEST(JinjaFilters, FilterResultsBehaveLikeJinja2Generators) {
  // jinja2's select/map/... return generators: always true in an `if`, no len(), no indexing.
  EXPECT_EQ(render("{% if [] | select('odd') %}truthy{% endif %}|{% if [] | select('odd') | list %}{% else %}empty{% endif %}"),
            "truthy|empty");
  EXPECT_EQ(render("{{ [1, 2] | reverse | list }}|{{ [3, 1] | map('string') | join('-') }}|{{ {'a': 1} | items | list }}"),
            "[2, 1]|3-1|[('a', 1)]");
  EXPECT_ERROR_CONTAINS(error_of("{{ [1] | select('odd') | length }}"), "object of type 'generator' has no len()");
  EXPECT_ERROR_CONTAINS(error_of("{{ ([1] | map('abs'))[0] }}"), "'generator' object is not subscriptable");
  EXPECT_ERROR_CONTAINS(error_of("{{ [1] | unique | tojson }}"), "Object of type generator is not JSON serializable");
  // safe makes a (Markup) string; int/float of an undefined value raise, as in Python.
  EXPECT_EQ(render("{{ (1 | safe) is string }}|{{ [1] | safe | list | length }}"), "True|3");
  EXPECT_ERROR_CONTAINS(error_of("{{ missing | int }}"), "'missing' is undefined");
}

// ---- tests ----

TEST(JinjaTests, TypeTests) {
  const json ctx = json::parse(R"({"s": "x", "i": 1, "f": 1.5, "b": true, "n": null, "l": [1], "d": {"a": 1}})");
  EXPECT_EQ(render("{{ s is string }}{{ i is string }}{{ i is number }}{{ f is number }}{{ b is number }}"
                   "{{ i is integer }}{{ b is integer }}{{ f is float }}{{ b is boolean }}",
                   ctx),
            "TrueFalseTrueTrueTrueTrueFalseTrueTrue");
  EXPECT_EQ(render("{{ n is none }}{{ missing is none }}{{ d is mapping }}{{ l is mapping }}{{ l is iterable }}"
                   "{{ s is iterable }}{{ i is iterable }}{{ l is sequence }}{{ d is sequence }}",
                   ctx),
            "TrueFalseTrueFalseTrueTrueFalseTrueTrue");
  EXPECT_EQ(render("{{ b is true }}{{ i is true }}{{ false is false }}{{ n is not none }}{{ s is not string }}"
                   "{{ range is callable }}",
                   ctx),
            "TrueFalseTrueFalseFalseTrue");
}

TEST(JinjaTests, ValueTests) {
  EXPECT_EQ(render("{{ 3 is odd }}{{ 3 is even }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(4) }}{{ 1 is eq 1 }}"
                   "{{ 'a' is equalto('a') }}{{ 2 is gt 1 }}{{ 2 is in [1, 2] }}{{ 'ab' is lower }}{{ 'AB' is upper }}"),
            "TrueFalseTrueFalseTrueTrueTrueTrueTrueTrue");
  EXPECT_EQ(render("{{ x is sameas x }}{{ none is sameas none }}{{ 1 is sameas true }}", {{"x", {1}}}), "TrueTrueFalse");
  // Python's % decides: floats can be even, 2.5 is neither.
  EXPECT_EQ(render("{{ 2.5 is odd }}{{ 2.5 is even }}{{ 3.0 is odd }}{{ 4.0 is divisibleby 2 }}{{ [1] is lower }}"),
            "FalseFalseTrueTrueFalse");
}

// ---- globals ----

TEST(JinjaGlobals, RangeNamespaceDict) {
  EXPECT_EQ(render("{{ range(3) | list }}|{{ range(1, 7, 2) | list }}|{{ range(5, 0, -2) | list }}|{{ range(0) | list }}"),
            "[0, 1, 2]|[1, 3, 5]|[5, 3, 1]|[]");
  EXPECT_EQ(render("{{ dict(a=1, b='x') }}"), "{'a': 1, 'b': 'x'}");
}

TEST(JinjaGlobals, StrftimeNowUsesTheInjectedClock) {
  EXPECT_EQ(render("{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%d %H:%M:%S %A %B %j') }}"),
            "14 Mar 2025|2025-03-14 09:26:53 Friday March 073");
  // Without an injected clock: today's date, in the same shape.
  const std::string today = render("{{ strftime_now('%Y') }}", json::object(), RenderOptions{});
  EXPECT_EQ(today.size(), 4u);
}

TEST(JinjaGlobals, RaiseExceptionCarriesTheTemplateMessage) {
  const auto t = Template::parse("line one\n{{ raise_exception('Roles must alternate: ' ~ n) }}");
  try {
    t.render({{"n", 3}});
    FAIL() << "expected a TemplateException";
  } catch (const TemplateException& e) {
    EXPECT_EQ(e.template_message(), "Roles must alternate: 3");
    EXPECT_ERROR_CONTAINS(e.what(), "line 2");
    EXPECT_ERROR_CONTAINS(e.what(), "Roles must alternate: 3");
  }
}

// ---- errors ----

TEST(JinjaErrors, SyntaxErrorsNameLineAndColumn) {
  EXPECT_ERROR_CONTAINS(error_of("ok\n{% if x %}never closed"),
                        "line 2, column 23: unexpected end of template; expected 'elif' or 'else' or 'endif' to close "
                        "the block at line 2");
  EXPECT_ERROR_CONTAINS(error_of("{{ x "), "missing '}}'");
  EXPECT_ERROR_CONTAINS(error_of("a\n  {% if x "), "line 2, column 3");
  EXPECT_ERROR_CONTAINS(error_of("{# never closed"), "missing end of comment");
  EXPECT_ERROR_CONTAINS(error_of("{{ 'abc }}"), "unterminated string");
  EXPECT_ERROR_CONTAINS(error_of("{% for x in y %}{% endif %}"), "unexpected 'endif'");
  EXPECT_ERROR_CONTAINS(error_of("{{ 1 + }}"), "unexpected '}}'");
  EXPECT_ERROR_CONTAINS(error_of("{{ (1 }}"), "unexpected '}'");
  EXPECT_ERROR_CONTAINS(error_of("{{ a ? b }}"), "unexpected character '?'");
  EXPECT_ERROR_CONTAINS(error_of("{% break %}"), "'break' outside of a for loop");
}

TEST(JinjaErrors, UnsupportedAndUnknownNamesFailAtParseTime) {
  EXPECT_ERROR_CONTAINS(error_of("{% if false %}{{ x | nosuchfilter }}{% endif %}"), "no filter named 'nosuchfilter'");
  EXPECT_ERROR_CONTAINS(error_of("{{ x is nosuchtest }}"), "no test named 'nosuchtest'");
  EXPECT_ERROR_CONTAINS(error_of("{% include 'other.jinja' %}"), "'include' statements are not supported");
  EXPECT_ERROR_CONTAINS(error_of("{% frobnicate %}"), "unknown statement 'frobnicate'");
  EXPECT_ERROR_CONTAINS(error_of("{% for x in y recursive %}{% endfor %}"), "recursive for loops are not supported");
}

TEST(JinjaErrors, RuntimeErrorsNameTheLocation) {
  EXPECT_ERROR_CONTAINS(error_of("\n\n  {{ 1 // 0 }}"), "line 3, column 8: integer division or modulo by zero");
  EXPECT_ERROR_CONTAINS(error_of("{{ missing + 1 }}"), "'missing' is undefined");
  EXPECT_ERROR_CONTAINS(error_of("{{ 'a' + 1 }}"), "unsupported operand type(s) for +: 'str' and 'int'");
  EXPECT_ERROR_CONTAINS(error_of("{{ 'x'.zfill(3) }}"), "'str object' has no attribute 'zfill'");
  EXPECT_ERROR_CONTAINS(error_of("{{ nofunc() }}"), "'nofunc' is undefined");
  EXPECT_ERROR_CONTAINS(error_of("{{ 1 < 'a' }}"), "'<' not supported between instances of 'int' and 'str'");
  EXPECT_ERROR_CONTAINS(error_of("{% for x in 5 %}{% endfor %}"), "'int' object is not iterable");
  EXPECT_ERROR_CONTAINS(error_of("{% set d = {} %}{% set d.x = 1 %}"), "not a namespace");
  EXPECT_ERROR_CONTAINS(error_of("{% for a, b in [[1, 2, 3]] %}{% endfor %}"), "too many values to unpack");
  EXPECT_ERROR_CONTAINS(error_of("{{ x | tojson }}"), "Object of type Undefined is not JSON serializable");
  EXPECT_ERROR_CONTAINS(error_of("{{ [].append(1) }}"), "has no attribute 'append'");  // sandboxed: no mutation
  EXPECT_ERROR_CONTAINS(error_of("{{ '%s' % 1 }}"), "printf-style");
}

TEST(JinjaErrors, RecursionIsBounded) {
  EXPECT_ERROR_CONTAINS(error_of("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"), "nested deeper than 256");
  // Parsing bounds nesting before anything recurses deeply.
  EXPECT_ERROR_CONTAINS(error_of("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}"),
                        "parentheses, brackets or unary operators nested more than 48 levels deep");
  EXPECT_ERROR_CONTAINS(error_of("{{ " + std::string(5000, '[') + std::string(5000, ']') + " }}"), "nested more than 48");
  EXPECT_ERROR_CONTAINS(error_of("{{ " + std::string(5000, '-') + "1 }}"), "nested more than 48");
  EXPECT_EQ(render("{{ " + std::string(40, '(') + "1" + std::string(40, ')') + " }}"), "1");
  std::string chain = "{{ 1";
  for (int i = 0; i < 5000; ++i) chain += "|abs";
  EXPECT_ERROR_CONTAINS(error_of(chain + " }}"), "nested more than 128 levels");
  std::string sum = "{{ 1";
  for (int i = 0; i < 5000; ++i) sum += " + 1";
  EXPECT_ERROR_CONTAINS(error_of(sum + " }}"), "nested more than 128 levels");
  std::string blocks;
  for (int i = 0; i < 5000; ++i) blocks += "{% if true %}";
  EXPECT_ERROR_CONTAINS(error_of(blocks), "statements nested more than 64");
  EXPECT_ERROR_CONTAINS(error_of("{% set ns = namespace(l=[]) %}{% for i in range(1000) %}{% set ns.l = [ns.l] %}{% endfor %}"),
                        "nested more than 256 levels");
  EXPECT_ERROR_CONTAINS(error_of("{% set ns = namespace() %}{% set ns.me = ns %}"), "cannot store a namespace");
  // Built by the (iterative) parser: copying a json this deep would itself recurse 10000 times.
  const json deep = json::parse("{\"x\": " + std::string(10000, '[') + std::string(10000, ']') + "}");
  EXPECT_ERROR_CONTAINS(error_of("{{ x }}", deep), "context value nested more than 256 levels deep");
}

TEST(JinjaErrors, OutputSizeIsBounded) {
  RenderOptions small = test_options();
  small.max_output_bytes = 1000;
  EXPECT_ERROR_CONTAINS(error_of("{% for i in range(200) %}0123456789{% endfor %}", json::object(), small),
                        "rendered output exceeds the limit of 1000 bytes");
  EXPECT_ERROR_CONTAINS(error_of("{{ 'x' * 100000000 }}"), "string repetition would exceed 16777216 bytes");
  EXPECT_ERROR_CONTAINS(error_of("{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
                                 "{% endfor %}"),
                        "exceeds the limit of 16777216 bytes");
  EXPECT_EQ(render("{% for i in range(100) %}0123456789{% endfor %}", json::object(), small).size(), 1000u);
}

TEST(JinjaErrors, WorkIsBounded) {
  EXPECT_EQ(RenderOptions{}.max_steps, 10'000'000u);
  RenderOptions options = test_options();
  options.max_steps = 1'000'000;
  EXPECT_ERROR_CONTAINS(error_of("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                                 json::object(), options),
                        "budget of 1000000 evaluation steps");
  EXPECT_ERROR_CONTAINS(error_of("{% for i in range(1000000) %}{% endfor %}"), "range too big");
  EXPECT_ERROR_CONTAINS(error_of("{% set ns = namespace(l=range(100000) | list) %}{% for i in range(100000) %}"
                                 "{% if i in ns.l %}{% endif %}{% endfor %}"),
                        "budget");
}

TEST(JinjaErrors, ContextMustBeAnObject) {
  EXPECT_ERROR_CONTAINS(error_of("x", json::array()), "context must be a JSON object");
}

// ---- real chat templates against goldens from @huggingface/jinja ----

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

TEST(JinjaGoldens, RealChatTemplatesRenderByteForByte) {
  const std::filesystem::path dir = std::filesystem::path(SPECULA_SOURCE_DIR) / "tests/data/chat_templates";
  int families = 0;
  int cases = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    const std::string suffix = ".golden.json";
    if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    const std::string family = name.substr(0, name.size() - suffix.size());
    SCOPED_TRACE(family);
    const Template t = Template::parse(read_file(dir / (family + ".jinja")));
    const json goldens = json::parse(read_file(entry.path()));
    ASSERT_TRUE(goldens.is_array());
    ++families;
    for (const json& golden : goldens) {
      SCOPED_TRACE(golden["name"].get<std::string>());
      ++cases;
      if (golden.contains("output")) {
        EXPECT_EQ(t.render(golden["context"], test_options()), golden["output"].get<std::string>());
      } else {
        try {
          t.render(golden["context"], test_options());
          ADD_FAILURE() << "expected the template to raise: " << golden["error"];
        } catch (const TemplateException& e) {
          EXPECT_EQ(e.template_message(), golden["error"].get<std::string>());
        }
      }
    }
  }
  EXPECT_GE(families, 7);
  EXPECT_GE(cases, 60);
  std::printf("rendered %d cases of %d chat template families\n", cases, families);
}

}  // namespace
}  // namespace specula::jinja
