// JsonReader: every read of untrusted JSON checked for presence, type and range.
#include "specula/core/json_reader.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "specula/core/error.h"

namespace specula {

namespace {

// A short rendering of a value for an error message.
std::string show(const nlohmann::json& j) {
  std::string s = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

}  // namespace

std::string read_text_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  SPECULA_CHECK(in.good(), "cannot read {}: {}", path.string(), std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  SPECULA_CHECK(!in.bad(), "cannot read {}: {}", path.string(), std::strerror(errno));
  return text.str();
}

JsonReader::json JsonReader::parse_file(const std::filesystem::path& path, const std::string& file) {
  return parse(read_text_file(path), file.empty() ? path.string() : file);
}

JsonReader::JsonReader(const json& node, std::string file, std::string path)
    : node_(&node), file_(std::move(file)), path_(std::move(path)) {}

JsonReader::json JsonReader::parse(std::string_view text, const std::string& file) {
  constexpr int kMaxDepth = 64;
  // The SAX callback sees each object's keys as they are read; a stack of key sets finds
  // duplicates at any depth. Objects and arrays nest, so arrays push a placeholder too.
  std::vector<std::set<std::string>> keys;
  std::string duplicate;
  const json::parser_callback_t callback = [&](int depth, json::parse_event_t event, json& parsed) {
    // Deeper documents are no config, tokenizer or request anyone writes, and rendering or
    // copying one recursively could exhaust a thread's stack.
    SPECULA_CHECK(depth <= kMaxDepth, "{} nests objects and arrays deeper than {} levels", file, kMaxDepth);
    switch (event) {
      case json::parse_event_t::object_start: keys.emplace_back(); break;
      case json::parse_event_t::array_start: keys.emplace_back(); break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case json::parse_event_t::key:
        if (!keys.empty() && !keys.back().insert(parsed.get<std::string>()).second && duplicate.empty()) {
          duplicate = parsed.get<std::string>();
        }
        break;
      default: break;
    }
    return true;
  };
  json j;
  try {
    j = json::parse(text.begin(), text.end(), callback);
  } catch (const json::exception& e) {
    // what() starts with nlohmann's "[json.exception.parse_error.101] " tag: not for users.
    std::string_view what = e.what();
    if (what.starts_with("[json.exception.")) what.remove_prefix(std::min(what.size(), what.find("] ") + 2));
    SPECULA_CHECK(false, "{} is not valid JSON: {}", file, what);
  }
  SPECULA_CHECK(duplicate.empty(), "{}: the key '{}' appears twice in one object", file, duplicate);
  return j;
}

std::string JsonReader::child_path(std::string_view key) const {
  return path_.empty() ? std::string(key) : fmt::format("{}.{}", path_, key);
}

std::string JsonReader::where() const { return path_.empty() ? std::string("the top level") : "'" + path_ + "'"; }

void JsonReader::fail(const std::string& what) const {
  SPECULA_CHECK(false, "{}: {} {}", file_, where(), what);
  std::abort();  // unreachable: SPECULA_CHECK(false) throws
}

void JsonReader::expect(bool ok, const char* type) const {
  if (!ok) fail(fmt::format("must be {}, not {}", type, show(*node_)));
}

bool JsonReader::has(std::string_view key) const {
  if (!node_->is_object()) return false;
  const auto it = node_->find(key);
  return it != node_->end() && !it->is_null();
}

JsonReader JsonReader::at(std::string_view key) const {
  expect(node_->is_object(), "an object");
  const auto it = node_->find(key);
  if (it == node_->end()) SPECULA_CHECK(false, "{}: '{}' is missing", file_, child_path(key));
  return JsonReader(*it, file_, child_path(key));
}

std::optional<JsonReader> JsonReader::find(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  return JsonReader(*node_->find(key), file_, child_path(key));
}

size_t JsonReader::size() const {
  expect(node_->is_array(), "an array");
  return node_->size();
}

JsonReader JsonReader::operator[](size_t i) const {
  SPECULA_ASSERT(i < size());
  return JsonReader((*node_)[i], file_, fmt::format("{}[{}]", path_, i));
}

void JsonReader::for_each(const std::function<void(const JsonReader&)>& f) const {
  const size_t n = size();
  for (size_t i = 0; i < n; ++i) f((*this)[i]);
}

void JsonReader::for_each_member(const std::function<void(const std::string&, const JsonReader&)>& f) const {
  expect(node_->is_object(), "an object");
  for (auto it = node_->begin(); it != node_->end(); ++it) f(it.key(), JsonReader(it.value(), file_, child_path(it.key())));
}

std::string JsonReader::string() const {
  expect(node_->is_string(), "a string");
  return node_->get<std::string>();
}

bool JsonReader::boolean() const {
  expect(node_->is_boolean(), "true or false");
  return node_->get<bool>();
}

int64_t JsonReader::integer(int64_t min, int64_t max) const {
  // Integers beyond int64 arrive as unsigned (or as floats); both are out of every range here.
  const bool in_int64 = node_->is_number_integer() &&
                        !(node_->is_number_unsigned() && node_->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX));
  if (!in_int64) {
    if (node_->is_number_integer()) fail(fmt::format("= {} is out of range [{}, {}]", show(*node_), min, max));
    expect(false, "an integer");
  }
  const int64_t v = node_->get<int64_t>();
  if (v < min || v > max) fail(fmt::format("= {} is out of range [{}, {}]", v, min, max));
  return v;
}

double JsonReader::number() const {
  expect(node_->is_number(), "a number");
  const double v = node_->get<double>();
  if (!std::isfinite(v)) fail(fmt::format("= {} is not a finite number", show(*node_)));
  return v;
}

std::string JsonReader::string_or(std::string_view key, const std::string& fallback) const {
  const auto member = find(key);
  return member ? member->string() : fallback;
}

bool JsonReader::bool_or(std::string_view key, bool fallback) const {
  const auto member = find(key);
  return member ? member->boolean() : fallback;
}

int64_t JsonReader::int_or(std::string_view key, int64_t fallback, int64_t min, int64_t max) const {
  const auto member = find(key);
  return member ? member->integer(min, max) : fallback;
}

double JsonReader::number_or(std::string_view key, double fallback) const {
  const auto member = find(key);
  return member ? member->number() : fallback;
}

}  // namespace specula
