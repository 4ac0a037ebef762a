// JsonReader: checked, read-only access to untrusted JSON (config.json, tokenizer.json, a
// safetensors header). Every accessor checks presence, type and range before reading and throws
// specula::Error naming the file, the key path and the value ("tokenizer.json:
// added_tokens[3].id = -1 is out of range [0, 16777216]"), so neither nlohmann's exceptions nor
// its unchecked operator[] on a const object (undefined behaviour for a missing key) is ever
// reached by a malformed file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace specula {

// The whole file as bytes; throws specula::Error "cannot read <path>: <reason>".
std::string read_text_file(const std::filesystem::path& path);

class JsonReader {
 public:
  using json = nlohmann::json;

  // `file` names the document in errors; `path` is this node's key path inside it.
  JsonReader(const json& node, std::string file, std::string path = {});

  // Parses text, or throws specula::Error "<file> is not valid JSON: ...". Duplicate keys in an
  // object are refused (nlohmann would silently keep the last one), and so is nesting deeper
  // than 64 levels.
  static json parse(std::string_view text, const std::string& file);
  // read_text_file, then parse with `file` (default: the path) naming it in errors.
  static json parse_file(const std::filesystem::path& path, const std::string& file = {});

  const json& raw() const { return *node_; }
  const std::string& path() const { return path_; }
  bool is_null() const { return node_->is_null(); }
  bool is_object() const { return node_->is_object(); }
  bool is_array() const { return node_->is_array(); }
  bool is_string() const { return node_->is_string(); }

  // Object members. has(): present and not null. at(): present (any type, null included), else
  // an error naming the missing key. find(): the member when present and not null.
  bool has(std::string_view key) const;
  JsonReader at(std::string_view key) const;
  std::optional<JsonReader> find(std::string_view key) const;

  // Arrays: size() and element i (this node must be an array).
  size_t size() const;
  JsonReader operator[](size_t i) const;
  void for_each(const std::function<void(const JsonReader&)>& f) const;
  // Objects: every (key, value) in key order.
  void for_each_member(const std::function<void(const std::string&, const JsonReader&)>& f) const;

  // This node's value, checked.
  std::string string() const;
  bool boolean() const;
  int64_t integer(int64_t min, int64_t max) const;
  double number() const;  // finite

  // Member `key` when present and not null, else the fallback; a present member of the wrong
  // type is an error, never silently the fallback.
  std::string string_or(std::string_view key, const std::string& fallback) const;
  bool bool_or(std::string_view key, bool fallback) const;
  int64_t int_or(std::string_view key, int64_t fallback, int64_t min, int64_t max) const;
  double number_or(std::string_view key, double fallback) const;

  // Throws specula::Error "<file>: '<path>' <what>".
  [[noreturn]] void fail(const std::string& what) const;

 private:
  std::string child_path(std::string_view key) const;
  std::string where() const;
  void expect(bool ok, const char* type) const;

  const json* node_;
  std::string file_;
  std::string path_;
};

}  // namespace specula
