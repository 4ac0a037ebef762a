// `specula bench serve`: an offline serving benchmark through the Engine (SGLang's
// bench_serving, without HTTP): N requests with given input/output lengths, random or sharing
// prefixes, all at once or at a Poisson request rate; reports throughput, time to first token,
// inter-token latency and the prefix-cache hit rate.
#pragma once

#include <CLI/CLI.hpp>

namespace specula {

void add_bench_serve_command(CLI::App& bench);

}  // namespace specula
