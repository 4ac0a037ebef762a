// `specula generate`: text generation with a Hugging Face model folder (default: the shipped
// models/specula-byte-6m), streaming text, or one JSON object with --json.
#pragma once

#include <CLI/CLI.hpp>

namespace specula {

void add_generate_command(CLI::App& app);

}  // namespace specula
