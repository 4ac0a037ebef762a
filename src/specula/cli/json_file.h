// Writes a benchmark's --json result file, or fails with one line naming the path.
#pragma once

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "specula/core/error.h"

namespace specula {

inline void write_json_file(const std::string& path, const nlohmann::json& j) {
  std::ofstream file(path);
  file << j.dump(2) << "\n";
  SPECULA_CHECK(file.good(), "--json {}: cannot write the file", path);
}

}  // namespace specula
