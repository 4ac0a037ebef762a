// Random sentences of a grammar (issue 51's tests and `specula bench grammar`): a random walk of
// the automaton over a set of letters, then the shortest way to finish it, so that every result
// is a whole sentence (a document of a JSON schema, a match of a regex).
#pragma once

#include <random>
#include <string>
#include <vector>

#include "specula/grammar/matcher.h"

namespace specula::grammar {

// Printable ASCII, a line break and three multi-byte code points: what a walk picks from.
std::vector<std::string> sentence_letters();

// The shortest text that lets `state` end (its stacks' remainders filled with each rule's
// shortest sentence, classes with their first printable code point).
std::string shortest_completion(const Automaton& automaton, const MatchState& state);

// A random walk of up to max_letters letters among those that keep a parse alive (stopping early,
// with chance 1/3 per step, where the text may end), then the shortest completion.
std::string random_sentence(const Automaton& automaton, std::mt19937& rng, int max_letters,
                            const std::vector<std::string>& letters = sentence_letters());

}  // namespace specula::grammar
