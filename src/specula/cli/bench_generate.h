// `specula bench generate`: prefill and decode speed of one request, for a model folder or a
// synthetic model of a named shape, next to the weight-bandwidth bound measured in the same run.
#pragma once

#include <CLI/CLI.hpp>

namespace specula {

void add_bench_generate_command(CLI::App& bench);

}  // namespace specula
