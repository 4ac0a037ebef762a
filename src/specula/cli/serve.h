// `specula serve`: the OpenAI-compatible HTTP server over one engine (src/specula/server/).
#pragma once

#include <CLI/CLI.hpp>

namespace specula {

void add_serve_command(CLI::App& app);

}  // namespace specula
