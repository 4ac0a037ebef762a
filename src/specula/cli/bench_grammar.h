// `specula bench grammar`: the cost of structured output on the CPU (issue 51's targets). For each
// schema of a corpus (tests/grammar/data/schemas.jsonl by default) and for free-form JSON: the
// compile time (schema -> grammar -> automaton), then documents of the grammar (random walks
// finished by the shortest completion) encoded with a real tokenizer (a Llama-3 tokenizer.json of
// 128,256 tokens by default) and replayed token by token through a constraint, timing each
// next-token mask over the whole vocabulary (cold: the first document of a grammar, filling the
// mask cache; warm: later ones) and the single-token check greedy decoding makes first.
#pragma once

#include <CLI/CLI.hpp>

namespace specula {

void add_bench_grammar_command(CLI::App& bench);

}  // namespace specula
