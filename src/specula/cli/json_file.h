// A benchmark's --json result file: checked before the benchmark runs (so a bad path fails in
// a second, not after the run) and written with every error reported, the final flush included
// (a full disk or /dev/full), as one line naming the path.
#pragma once

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "specula/core/error.h"

namespace specula {

// Opens the file for appending now (creating it, leaving what it holds); the results replace it
// when they are written.
inline void check_json_path(const std::string& path) {
  if (path.empty()) return;
  std::ofstream file(path, std::ios::out | std::ios::app);
  SPECULA_CHECK(file.is_open(), "--json {}: cannot open the file for writing: {}", path, std::strerror(errno));
}

inline void write_json_file(const std::string& path, const nlohmann::json& j) {
  std::ofstream file(path, std::ios::out | std::ios::trunc);
  SPECULA_CHECK(file.is_open(), "--json {}: cannot open the file for writing: {}", path, std::strerror(errno));
  file << j.dump(2) << "\n";
  file.close();
  SPECULA_CHECK(!file.fail(), "--json {}: writing the file failed: {}", path, std::strerror(errno));
}

}  // namespace specula
