// `specula bench spec-cost`: the cost side of speculative decoding at real scale (issue 50, item
// 3). A synthetic target of a named shape (random weights, as `bench generate` makes them) with a
// synthetic EAGLE-3 head of the published Llama-3 heads' shape; the plain DECODE step and one
// cycle of every draft shape the auto policy may pick are timed at each batch size on stand-in
// requests (speculative/spec_calibration.h), and for accept lengths 2..6 the projected speed-up
// over plain decoding (accept length x plain step / cycle) is printed: what a user with a trained
// pair of that shape would get.
#pragma once

#include <CLI/CLI.hpp>

namespace specula {

void add_bench_spec_cost_command(CLI::App& bench);

}  // namespace specula
