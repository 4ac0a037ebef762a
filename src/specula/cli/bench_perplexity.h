// `specula bench perplexity`: the model's loss on a text, token by token, with every prediction
// after a short prefill made by a decode step (so decode-only attention such as double sparsity
// is what is measured); windows of the text run side by side as one batch.
#pragma once

#include <CLI/CLI.hpp>

namespace specula {

void add_bench_perplexity_command(CLI::App& bench);

}  // namespace specula
