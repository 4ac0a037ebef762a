// The real JSON Schema validator the structured-output tests check against: ajv 2020 with
// ajv-formats, run by Node from tests/grammar/js (installed by scripts/setup.sh) over the schema
// corpus tests/grammar/data/schemas.jsonl.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace specula::grammar::testing {

inline std::filesystem::path source_dir() { return SPECULA_SOURCE_DIR; }

// The corpus: one {"name", "schema"} per line.
inline std::vector<nlohmann::ordered_json> schema_corpus() {
  std::ifstream in(source_dir() / "tests/grammar/data/schemas.jsonl");
  std::vector<nlohmann::ordered_json> schemas;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) schemas.push_back(nlohmann::ordered_json::parse(line));
  }
  return schemas;
}

inline bool ajv_installed() { return std::filesystem::exists(source_dir() / "tests/grammar/js/node_modules/ajv"); }

// Validates (corpus index, text) pairs; returns the validator's exit status (0: all valid) and
// its output (a FAIL line per invalid document, then a summary).
inline std::pair<int, std::string> validate_with_ajv(const std::vector<std::pair<int, std::string>>& documents) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("specula_ajv_" + std::to_string(::getpid()) + "_" + std::to_string(std::rand()));
  std::filesystem::create_directories(dir);
  {
    std::ofstream out(dir / "documents.jsonl");
    for (const auto& [schema, text] : documents) out << nlohmann::json{{"schema", schema}, {"text", text}}.dump() << "\n";
  }
  const std::string cmd = "cd '" + (source_dir() / "tests/grammar/js").string() + "' && node validate.mjs '" +
                          (source_dir() / "tests/grammar/data/schemas.jsonl").string() + "' '" +
                          (dir / "documents.jsonl").string() + "' > '" + (dir / "out.txt").string() + "' 2>&1";
  const int status = std::system(cmd.c_str());
  std::ifstream in(dir / "out.txt");
  std::stringstream text;
  text << in.rdbuf();
  std::filesystem::remove_all(dir);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, text.str()};
}

}  // namespace specula::grammar::testing
