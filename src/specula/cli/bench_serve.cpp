// `specula bench serve`.
#include "specula/cli/bench_serve.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fstream>
#include <sstream>

#include "specula/cli/engine_flags.h"
#include "specula/cli/json_file.h"
#include "specula/core/error.h"
#include "specula/model/synthetic.h"
#include "specula/runtime/engine.h"

namespace specula {

namespace {

struct Options {
  EngineFlags engine;
  std::string synthetic;
  int num_requests = 64;
  int input_len = 256;
  int output_len = 64;
  std::string dataset = "random";
  std::string dataset_file;       // text: the file prompts are cut from
  int num_prefixes = 4;         // shared-prefix: distinct prefixes, requests spread over them
  double prefix_fraction = 0.75;  // shared-prefix: part of each prompt that is shared
  double request_rate = 0;        // requests/s (Poisson); 0: all at once
  uint64_t seed = 1;
  std::string json_path;
};

struct Summary {
  double mean = 0, median = 0, p99 = 0;
};

Summary summarize(std::vector<double> v) {
  Summary s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / static_cast<double>(v.size());
  s.median = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  // Nearest-rank percentile.
  const auto rank = static_cast<size_t>(std::ceil(0.99 * static_cast<double>(v.size())));
  s.p99 = v[std::max<size_t>(rank, 1) - 1];
  return s;
}

std::vector<std::vector<int32_t>> make_prompts(const Options& o, int vocab, const Tokenizer* tokenizer) {
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int32_t> token(0, vocab - 1);
  auto random_ids = [&](int n) {
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int32_t& id : ids) id = token(rng);
    return ids;
  };
  std::vector<std::vector<int32_t>> prompts;
  if (o.dataset == "random") {
    for (int i = 0; i < o.num_requests; ++i) prompts.push_back(random_ids(o.input_len));
    return prompts;
  }
  if (o.dataset == "text") {
    // Natural text (what speculative decoding is measured on): windows of the file, spread evenly.
    SPECULA_CHECK(tokenizer != nullptr, "--dataset text needs a model with a tokenizer");
    const std::filesystem::path path =
        o.dataset_file.empty() ? shipped_model("specula-byte-6m") / "README.md" : std::filesystem::path(o.dataset_file);
    std::ifstream in(path);
    SPECULA_CHECK(in.good(), "--dataset-file {}: cannot read the file", path.string());
    std::stringstream text;
    text << in.rdbuf();
    const std::vector<int32_t> ids = tokenizer->encode(text.str());
    SPECULA_CHECK(static_cast<int>(ids.size()) > o.input_len, "--dataset-file {} has {} tokens; --input-len {} needs more",
                  path.string(), ids.size(), o.input_len);
    const auto room = static_cast<int64_t>(ids.size()) - o.input_len;
    for (int i = 0; i < o.num_requests; ++i) {
      const int64_t start = room * i / o.num_requests;
      prompts.emplace_back(ids.begin() + start, ids.begin() + start + o.input_len);
    }
    return prompts;
  }
  SPECULA_CHECK(o.dataset == "shared-prefix", "--dataset {} is not known; use random, shared-prefix or text", o.dataset);
  SPECULA_CHECK(o.num_prefixes >= 1, "--num-prefixes {} must be >= 1", o.num_prefixes);
  SPECULA_CHECK(o.prefix_fraction >= 0 && o.prefix_fraction < 1, "--prefix-fraction {} must be in [0, 1)",
                o.prefix_fraction);
  const int shared = static_cast<int>(o.prefix_fraction * o.input_len);
  std::vector<std::vector<int32_t>> prefixes;
  for (int g = 0; g < o.num_prefixes; ++g) prefixes.push_back(random_ids(shared));
  for (int i = 0; i < o.num_requests; ++i) {
    std::vector<int32_t> p = prefixes[static_cast<size_t>(i % o.num_prefixes)];
    const std::vector<int32_t> tail = random_ids(o.input_len - shared);
    p.insert(p.end(), tail.begin(), tail.end());
    prompts.push_back(std::move(p));
  }
  return prompts;
}

void run(const Options& o) {
  check_json_path(o.json_path);
  SPECULA_CHECK(o.num_requests >= 1, "--num-requests {} must be >= 1", o.num_requests);
  SPECULA_CHECK(o.input_len >= 1 && o.output_len >= 1, "--input-len {} and --output-len {} must be >= 1", o.input_len,
                o.output_len);
  SPECULA_CHECK(o.request_rate >= 0, "--request-rate {} must be >= 0 (0: all at once)", o.request_rate);
  // The arrivals span num_requests / rate seconds on average; a benchmark longer than a day is a
  // mistyped rate, not a measurement.
  constexpr double kMaxArrivalSeconds = 86400;
  const double min_rate = o.num_requests / kMaxArrivalSeconds;
  SPECULA_CHECK(o.request_rate == 0 || o.request_rate >= min_rate,
                "--request-rate {} would spread {} requests over about {:.3g} s; give 0 (all at once) or at least {:.3g} "
                "(a day at most)", o.request_rate, o.num_requests, o.num_requests / o.request_rate, min_rate);
  SPECULA_CHECK(o.synthetic.empty() || o.engine.model.empty(), "give at most one of --model and --synthetic");
  EngineOptions eo = engine_options(o.engine);
  eo.background_thread = true;
  // An offline benchmark may queue all of its requests at once.
  eo.scheduler.max_queued_requests = std::max(eo.scheduler.max_queued_requests, o.num_requests);
  if (eo.runner.max_context_len == 0) eo.runner.max_context_len = o.input_len + o.output_len;
  std::unique_ptr<Engine> engine;
  std::string what;
  if (!o.synthetic.empty()) {
    const ModelConfig config = synthetic_config(o.synthetic);
    const SyntheticWeights weights(config, 7);
    engine = std::make_unique<Engine>(config, weights, eo);
    what = "synthetic " + o.synthetic;
  } else {
    const auto folder = model_folder(o.engine);
    engine = std::make_unique<Engine>(folder, eo);
    what = folder.string();
  }
  const std::vector<std::vector<int32_t>> prompts = make_prompts(o, engine->config().vocab_size, engine->tokenizer());

  using Clock = std::chrono::steady_clock;
  std::mt19937_64 arrival_rng(o.seed + 1);
  std::exponential_distribution<double> gap(o.request_rate > 0 ? o.request_rate : 1.0);
  const auto start = Clock::now();
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (const auto& p : prompts) {
    EngineRequest r;
    r.prompt_ids = p;
    r.max_new_tokens = o.output_len;
    r.ignore_eos = true;
    handles.push_back(engine->submit(std::move(r)));
    if (o.request_rate > 0) std::this_thread::sleep_for(std::chrono::duration<double>(gap(arrival_rng)));
  }
  std::vector<RequestOutput> outs;
  for (const auto& h : handles) outs.push_back(h->wait());
  const double duration = std::chrono::duration<double>(Clock::now() - start).count();

  std::vector<double> ttft, itl, latency;
  int64_t in_tokens = 0, out_tokens = 0, cached = 0;
  // Decode speed as a request sees it: tokens after the first over the time after the first
  // (prefill and queueing excluded), averaged over requests.
  double decode_rate_sum = 0;
  for (const RequestOutput& out : outs) {
    SPECULA_CHECK(out.finish_reason == "length", "request {} ended with '{}'", out.id, out.finish_reason);
    ttft.push_back(out.time_to_first_token_s);
    latency.push_back(out.latency_s);
    for (size_t i = 1; i < out.token_times_s.size(); ++i) itl.push_back(out.token_times_s[i] - out.token_times_s[i - 1]);
    in_tokens += static_cast<int64_t>(out.prompt_ids.size());
    out_tokens += static_cast<int64_t>(out.output_ids.size());
    cached += out.cached_tokens;
    const double decode_s = out.latency_s - out.time_to_first_token_s;
    if (out.output_ids.size() > 1 && decode_s > 0) decode_rate_sum += static_cast<double>(out.output_ids.size() - 1) / decode_s;
  }
  const double decode_rate = decode_rate_sum / static_cast<double>(outs.size());
  const SchedulerStats stats = engine->stats();
  const Summary t = summarize(ttft), i = summarize(itl), l = summarize(latency);
  const double hit_rate = static_cast<double>(cached) / static_cast<double>(in_tokens);
  fmt::print("specula bench serve  {}  device={}  dataset={}  requests={}  input={}  output={}  rate={}\n", what,
             o.engine.device, o.dataset, o.num_requests, o.input_len, o.output_len,
             o.request_rate > 0 ? fmt::format("{}/s", o.request_rate) : std::string("all at once"));
  fmt::print("{:<32} {:>12.2f}\n", "duration s", duration);
  fmt::print("{:<32} {:>12.2f}\n", "request throughput req/s", o.num_requests / duration);
  fmt::print("{:<32} {:>12.1f}\n", "input tokens/s", static_cast<double>(in_tokens) / duration);
  fmt::print("{:<32} {:>12.1f}\n", "output tokens/s", static_cast<double>(out_tokens) / duration);
  fmt::print("{:<32} {:>12.1f}\n", "decode tokens/s per request", decode_rate);
  fmt::print("{:<32} {:>12.1f} {:>10.1f} {:>10.1f}\n", "TTFT ms (mean, median, p99)", t.mean * 1e3, t.median * 1e3, t.p99 * 1e3);
  fmt::print("{:<32} {:>12.2f} {:>10.2f} {:>10.2f}\n", "ITL ms (mean, median, p99)", i.mean * 1e3, i.median * 1e3, i.p99 * 1e3);
  fmt::print("{:<32} {:>12.1f} {:>10.1f} {:>10.1f}\n", "latency ms (mean, median, p99)", l.mean * 1e3, l.median * 1e3, l.p99 * 1e3);
  fmt::print("{:<32} {:>11.1f}%\n", "prefix cache hit rate", 100.0 * hit_rate);
  fmt::print("{:<32} {:>12}\n", "prefill tokens computed", stats.prefill_tokens);
  fmt::print("{:<32} {:>12}\n", "retractions", stats.retractions);
  const double accept_mean =
      stats.spec_cycles > 0 ? static_cast<double>(stats.spec_emitted_tokens) / static_cast<double>(stats.spec_cycles) : 0.0;
  if (eo.speculative) {
    const SpecParams& p = eo.speculative->params;
    fmt::print("{:<32} {:>12}\n", "speculative",
               fmt::format("{} ({}, {}, {})", eagle_kind_name(eo.speculative->kind), p.num_steps, p.topk, p.num_draft_tokens));
    fmt::print("{:<32} {:>12.3f}\n", "mean accept length", accept_mean);
    fmt::print("{:<32} {:>12}\n", "accept length histogram", fmt::format("{}", fmt::join(stats.spec_accept_histogram, " ")));
    const SpecTiming& tm = engine->speculative_worker()->timing();
    const double per = tm.cycles > 0 ? 1e3 / static_cast<double>(tm.cycles) : 0.0;
    fmt::print("{:<32} {:>12}\n", "ms per cycle: draft steps",
               fmt::format("{:.3f}  verify {:.3f}  accept {:.3f}  draft extend {:.3f}", tm.draft_steps_s * per,
                           tm.verify_s * per, tm.accept_s * per, tm.draft_extend_s * per));
  }
  if (!o.json_path.empty()) {
    auto summary = [](const Summary& s) { return nlohmann::json{{"mean", s.mean}, {"median", s.median}, {"p99", s.p99}}; };
    const nlohmann::json j = {{"model", what},
                              {"device", o.engine.device},
                              {"dataset", o.dataset},
                              {"num_requests", o.num_requests},
                              {"input_len", o.input_len},
                              {"output_len", o.output_len},
                              {"decode_tokens_per_s_per_request", decode_rate},
                              {"request_rate", o.request_rate},
                              {"duration_s", duration},
                              {"request_throughput", o.num_requests / duration},
                              {"input_tokens_per_s", static_cast<double>(in_tokens) / duration},
                              {"output_tokens_per_s", static_cast<double>(out_tokens) / duration},
                              {"ttft_s", summary(t)},
                              {"itl_s", summary(i)},
                              {"latency_s", summary(l)},
                              {"prefix_cache_hit_rate", hit_rate},
                              {"prefill_tokens", stats.prefill_tokens},
                              {"retractions", stats.retractions}};
    nlohmann::json out = j;
    if (eo.speculative) {
      const SpecParams& p = eo.speculative->params;
      out["speculative"] = {{"algorithm", eagle_kind_name(eo.speculative->kind)},
                            {"num_steps", p.num_steps},
                            {"topk", p.topk},
                            {"num_draft_tokens", p.num_draft_tokens},
                            {"verify_cycles", stats.spec_cycles},
                            {"accept_length_mean", accept_mean},
                            {"accept_histogram", stats.spec_accept_histogram}};
    }
    write_json_file(o.json_path, out);
  }
}

}  // namespace

void add_bench_serve_command(CLI::App& bench) {
  auto o = std::make_shared<Options>();
  CLI::App* cmd = bench.add_subcommand("serve", "Offline serving benchmark: many requests through the engine");
  add_engine_flags(*cmd, o->engine);
  cmd->add_option("--synthetic", o->synthetic, "A random-weight model of a named shape instead of --model");
  cmd->add_option("--num-requests", o->num_requests, "Requests")->capture_default_str();
  cmd->add_option("--input-len", o->input_len, "Prompt tokens per request")->capture_default_str();
  cmd->add_option("--output-len", o->output_len, "Generated tokens per request")->capture_default_str();
  cmd->add_option("--dataset", o->dataset, "random, shared-prefix or text")->capture_default_str();
  cmd->add_option("--dataset-file", o->dataset_file, "text: prompts are windows of this file (default: the shipped model's card)");
  cmd->add_option("--num-prefixes", o->num_prefixes, "shared-prefix: distinct prefixes")->capture_default_str();
  cmd->add_option("--prefix-fraction", o->prefix_fraction, "shared-prefix: shared part of each prompt")
      ->capture_default_str();
  cmd->add_option("--request-rate", o->request_rate, "Poisson arrival rate in requests/s (0: all at once)")
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed of the prompts and arrivals")->capture_default_str();
  cmd->add_option("--json", o->json_path, "Also write the results as JSON to this file");
  cmd->callback([o] { run(*o); });
}

}  // namespace specula
