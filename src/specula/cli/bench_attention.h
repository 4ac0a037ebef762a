// `specula bench attention`: times the attention backend of a device on standard decode and
// prefill shapes and prints a table (and JSON on request).
#pragma once

#include <CLI/CLI.hpp>

namespace specula {

void add_bench_attention_command(CLI::App& bench);

}  // namespace specula
