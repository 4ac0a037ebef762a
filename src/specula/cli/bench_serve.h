// `specula bench serve`: a serving benchmark (SGLang's bench_serving) through the Engine, or with
// --url through a running server's OpenAI API: N requests with given input/output lengths, random,
// sharing prefixes or text windows, all at once or at a Poisson request rate, at most
// --max-concurrency in flight; reports throughput, time to first token, inter-token latency and
// the prefix-cache hit rate.
#pragma once

#include <CLI/CLI.hpp>

namespace specula {

void add_bench_serve_command(CLI::App& bench);

}  // namespace specula
