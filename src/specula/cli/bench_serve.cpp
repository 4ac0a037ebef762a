// `specula bench serve`.
#include "specula/cli/bench_serve.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <fstream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "specula/cli/bench_serve_remote.h"
#include "specula/cli/engine_flags.h"
#include "specula/cli/format_flags.h"
#include "specula/cli/json_file.h"
#include "specula/cli/sample_stats.h"
#include "specula/core/error.h"
#include "specula/model/config.h"
#include "specula/model/synthetic.h"
#include "specula/model/tokenizer.h"
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
  std::string url;          // a running server to drive instead of a local engine
  int max_concurrency = 0;  // requests in flight at most (0: unlimited)
  std::vector<const CLI::Option*> engine_flag_options;  // refused with --url (but --model)
  FormatFlags format;     // structured output asked of every request
  std::string tokenizer;  // --synthetic: the tokenizer a format's grammar is built over
  float temperature = 0;
  std::string output_lens_from;  // an earlier run's --json: each request's output length
  int warmup_requests = 0;       // run first, untimed, with other prompts (warm caches)
};

// --output-lens-from: the "output_lens" of an earlier `bench serve --json`, one per request, each
// 1..--output-len; the requests then decode exactly that many tokens (a run without a format
// decoding what a run with one did: the same requests, the same lengths).
std::vector<int> read_output_lens(const Options& o) {
  if (o.output_lens_from.empty()) return {};
  std::ifstream file(o.output_lens_from);
  SPECULA_CHECK(file.is_open(), "--output-lens-from {}: cannot read the file", o.output_lens_from);
  const nlohmann::json j = nlohmann::json::parse(file, nullptr, /*allow_exceptions=*/false);
  SPECULA_CHECK(j.is_object() && j.contains("output_lens") && j["output_lens"].is_array(),
                "--output-lens-from {}: not a `bench serve --json` result with \"output_lens\"", o.output_lens_from);
  // The lengths belong to that run's prompts: the same dataset, prompt length and seed.
  auto same = [&](const char* key, const nlohmann::json& here) {
    SPECULA_CHECK(!j.contains(key) || j[key] == here, "--output-lens-from {}: that run had {} {}, this one {}",
                  o.output_lens_from, key, j[key].dump(), here.dump());
  };
  same("dataset", o.dataset);
  same("input_len", o.input_len);
  same("seed", o.seed);
  const nlohmann::json& lens = j["output_lens"];
  SPECULA_CHECK(static_cast<int>(lens.size()) == o.num_requests,
                "--output-lens-from {}: {} lengths for --num-requests {}", o.output_lens_from, lens.size(), o.num_requests);
  std::vector<int> out;
  for (const nlohmann::json& v : lens) {
    SPECULA_CHECK(v.is_number_integer() && v.get<int64_t>() >= 1 && v.get<int64_t>() <= o.output_len,
                  "--output-lens-from {}: length {} is not an integer in 1..--output-len {}", o.output_lens_from, v.dump(),
                  o.output_len);
    out.push_back(v.get<int>());
  }
  return out;
}

using Summary = SampleStats;

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

// Send times of the arrival process, in seconds after the start: all at once, or Poisson at
// --request-rate (request i goes out after the first i exponential gaps).
std::vector<double> arrival_times(const Options& o) {
  std::vector<double> at(static_cast<size_t>(o.num_requests), 0.0);
  if (o.request_rate <= 0) return at;
  std::mt19937_64 rng(o.seed + 1);
  std::exponential_distribution<double> gap(o.request_rate);
  double t = 0;
  for (double& a : at) {
    a = t;
    t += gap(rng);
  }
  return at;
}

// One benchmark's results: from the engine's own timings (offline) or from the client's (--url).
struct Report {
  std::string what, where;  // the model; "device=cpu" or "url=..."
  bool remote = false;
  int completed = 0, failed = 0;
  double duration = 0;
  int64_t in_tokens = 0, out_tokens = 0;
  std::vector<double> ttft, itl, latency;
  double decode_rate_sum = 0;
  // Engine-side figures, where the mode knows them.
  std::optional<double> hit_rate;
  std::optional<int64_t> prefill_tokens, retractions;
  std::vector<std::pair<std::string, std::string>> extra_lines;  // printed after the shared ones
  nlohmann::json extra_json = nlohmann::json::object();
  std::vector<std::string> errors;  // "request i: why", one per failed request

  // A completed request: its first-token time, token (or chunk) times and end, all from its send.
  void add(double ttft_s, const std::vector<double>& times_s, double latency_s, int64_t prompt_tokens,
           int64_t output_tokens) {
    ++completed;
    ttft.push_back(ttft_s);
    latency.push_back(latency_s);
    for (size_t k = 1; k < times_s.size(); ++k) itl.push_back(times_s[k] - times_s[k - 1]);
    in_tokens += prompt_tokens;
    out_tokens += output_tokens;
    // Decode speed as a request sees it: tokens after the first over the time after the first
    // (prefill and queueing excluded), averaged over requests.
    const double decode_s = latency_s - ttft_s;
    if (output_tokens > 1 && decode_s > 0) decode_rate_sum += static_cast<double>(output_tokens - 1) / decode_s;
  }
};

void print_report(const Options& o, const Report& r) {
  const double duration = r.duration;
  const double decode_rate = r.completed > 0 ? r.decode_rate_sum / r.completed : 0.0;
  const Summary t = summarize(r.ttft), i = summarize(r.itl), l = summarize(r.latency);
  fmt::print("specula bench serve  {}  {}  dataset={}  requests={}  input={}  output={}  rate={}{}\n", r.what, r.where,
             o.dataset, o.num_requests, o.input_len, o.output_len,
             o.request_rate > 0 ? fmt::format("{}/s", o.request_rate) : std::string("all at once"),
             o.max_concurrency > 0 ? fmt::format("  max-concurrency={}", o.max_concurrency) : std::string());
  if (r.remote) {
    fmt::print("{:<32} {:>12}\n", "completed requests", r.completed);
    fmt::print("{:<32} {:>12}\n", "failed requests", r.failed);
  }
  fmt::print("{:<32} {:>12.2f}\n", "duration s", duration);
  fmt::print("{:<32} {:>12.2f}\n", "request throughput req/s", r.completed / duration);
  fmt::print("{:<32} {:>12.1f}\n", "input tokens/s", static_cast<double>(r.in_tokens) / duration);
  fmt::print("{:<32} {:>12.1f}\n", "output tokens/s", static_cast<double>(r.out_tokens) / duration);
  fmt::print("{:<32} {:>12.1f}\n", "decode tokens/s per request", decode_rate);
  fmt::print("{:<32} {:>12.1f} {:>10.1f} {:>10.1f}\n", "TTFT ms (mean, median, p99)", t.mean * 1e3, t.median * 1e3, t.p99 * 1e3);
  fmt::print("{:<32} {:>12.2f} {:>10.2f} {:>10.2f}\n", "ITL ms (mean, median, p99)", i.mean * 1e3, i.median * 1e3, i.p99 * 1e3);
  fmt::print("{:<32} {:>12.1f} {:>10.1f} {:>10.1f}\n", "latency ms (mean, median, p99)", l.mean * 1e3, l.median * 1e3, l.p99 * 1e3);
  if (r.hit_rate) fmt::print("{:<32} {:>11.1f}%\n", "prefix cache hit rate", 100.0 * *r.hit_rate);
  if (r.prefill_tokens) fmt::print("{:<32} {:>12}\n", "prefill tokens computed", *r.prefill_tokens);
  if (r.retractions) fmt::print("{:<32} {:>12}\n", "retractions", *r.retractions);
  for (const auto& [name, value] : r.extra_lines) fmt::print("{:<32} {:>12}\n", name, value);
  constexpr size_t kErrorsShown = 5;
  for (size_t k = 0; k < std::min(kErrorsShown, r.errors.size()); ++k) fmt::print("failed: {}\n", r.errors[k]);
  if (r.errors.size() > kErrorsShown) fmt::print("failed: ... and {} more\n", r.errors.size() - kErrorsShown);
  if (o.json_path.empty()) return;
  auto summary = [](const Summary& s) { return nlohmann::json{{"mean", s.mean}, {"median", s.median}, {"p99", s.p99}}; };
  nlohmann::json j = {{"model", r.what},
                      {"dataset", o.dataset},
                      {"num_requests", o.num_requests},
                      {"completed", r.completed},
                      {"failed", r.failed},
                      {"input_len", o.input_len},
                      {"output_len", o.output_len},
                      {"seed", o.seed},
                      {"decode_tokens_per_s_per_request", decode_rate},
                      {"request_rate", o.request_rate},
                      {"max_concurrency", o.max_concurrency},
                      {"duration_s", duration},
                      {"total_input_tokens", r.in_tokens},
                      {"total_output_tokens", r.out_tokens},
                      {"request_throughput", r.completed / duration},
                      {"input_tokens_per_s", static_cast<double>(r.in_tokens) / duration},
                      {"output_tokens_per_s", static_cast<double>(r.out_tokens) / duration},
                      {"ttft_s", summary(t)},
                      {"itl_s", summary(i)},
                      {"latency_s", summary(l)}};
  if (r.hit_rate) j["prefix_cache_hit_rate"] = *r.hit_rate;
  if (r.prefill_tokens) j["prefill_tokens"] = *r.prefill_tokens;
  if (r.retractions) j["retractions"] = *r.retractions;
  if (!r.errors.empty()) j["errors"] = r.errors;
  j.update(r.extra_json);
  write_json_file(o.json_path, j);
}

void run_offline(const Options& o) {
  SPECULA_CHECK(o.synthetic.empty() || o.engine.model.empty(), "give at most one of --model and --synthetic");
  SPECULA_CHECK(o.tokenizer.empty() || !o.synthetic.empty(),
                "--tokenizer {} is for --synthetic (a model folder brings its own tokenizer)", o.tokenizer);
  SPECULA_CHECK(o.temperature >= 0, "--temperature {} must be >= 0", o.temperature);
  // Compiled once for every request, and refused before any model loads.
  const grammar::OutputFormat format = output_format(o.format);
  const bool constrained = format.kind != grammar::OutputFormat::Kind::kText;
  SPECULA_CHECK(!constrained || o.synthetic.empty() || !o.tokenizer.empty(),
                "a structured-output format needs a tokenizer: give --tokenizer DIR with --synthetic");
  const std::vector<int> output_lens = read_output_lens(o);
  EngineOptions eo = engine_options(o.engine);
  SPECULA_CHECK(o.warmup_requests == 0 || !eo.speculative,
                "--warmup-requests {}: not with speculation (its acceptance and policy figures would mix both runs)",
                o.warmup_requests);
  eo.background_thread = true;
  // An offline benchmark may queue all of its requests at once.
  eo.scheduler.max_queued_requests = std::max({eo.scheduler.max_queued_requests, o.num_requests, o.warmup_requests});
  if (eo.runner.max_context_len == 0) eo.runner.max_context_len = o.input_len + o.output_len;
  std::unique_ptr<Engine> engine;
  Report report;
  if (!o.synthetic.empty()) {
    const ModelConfig config = synthetic_config(o.synthetic);
    const SyntheticWeights weights(config, 7);
    std::unique_ptr<Tokenizer> tokenizer;
    if (!o.tokenizer.empty()) {
      tokenizer = std::make_unique<Tokenizer>(Tokenizer::from_folder(o.tokenizer));
      SPECULA_CHECK(tokenizer->vocab_size() <= config.vocab_size,
                    "--tokenizer {} has {} tokens; synthetic {} has a vocabulary of {}", o.tokenizer,
                    tokenizer->vocab_size(), o.synthetic, config.vocab_size);
    }
    engine = std::make_unique<Engine>(config, weights, eo, std::move(tokenizer));
    report.what = "synthetic " + o.synthetic;
  } else {
    const auto folder = model_folder(o.engine);
    engine = std::make_unique<Engine>(folder, eo);
    report.what = folder.string();
  }
  report.where = "device=" + o.engine.device;
  const std::vector<std::vector<int32_t>> prompts = make_prompts(o, engine->config().vocab_size, engine->tokenizer());
  const std::vector<double> send_at = arrival_times(o);
  // Every request, warm-up or timed: ignore_eos, the format and the sampling of the run.
  auto request = [&](std::vector<int32_t> ids, int max_new_tokens, uint64_t seed) {
    EngineRequest r;
    r.prompt_ids = std::move(ids);
    r.max_new_tokens = max_new_tokens;
    r.ignore_eos = true;
    r.format = format;
    r.sampling.temperature = o.temperature;
    r.sampling.seed = seed;
    return r;
  };
  // A format's grammar may end a request before its length ("stop").
  auto check_ended = [&](const RequestOutput& out, const char* what) {
    SPECULA_CHECK(out.finish_reason == "length" || (constrained && out.finish_reason == "stop"),
                  "{} {} ended with '{}'", what, out.id, out.finish_reason);
  };
  if (o.warmup_requests > 0) {
    // Other prompts (another seed; run() refuses --dataset text, whose windows ignore it), the
    // same format and sampling: the grammar's masker and the host's allocations warm, nothing of
    // the timed prompts cached.
    Options w = o;
    w.num_requests = o.warmup_requests;
    w.seed = o.seed + 0x9e3779b9u;
    std::vector<std::shared_ptr<RequestHandle>> warm;
    for (std::vector<int32_t>& ids : make_prompts(w, engine->config().vocab_size, engine->tokenizer())) {
      warm.push_back(engine->submit(request(std::move(ids), o.output_len, w.seed + warm.size())));
    }
    for (const auto& h : warm) check_ended(h->wait(), "warm-up request");
  }
  const SchedulerStats before = engine->stats();

  using Clock = std::chrono::steady_clock;
  // --max-concurrency: a request that arrives while that many are in flight waits for one to
  // finish (the engine's stepping thread frees the slot; shared, so it outlives this frame).
  struct Slots {
    std::mutex mu;
    std::condition_variable freed;
    int in_flight = 0;
  };
  const auto slots = std::make_shared<Slots>();
  const auto start = Clock::now();
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (size_t k = 0; k < prompts.size(); ++k) {
    std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(send_at[k])));
    EngineRequest r = request(prompts[k], output_lens.empty() ? o.output_len : output_lens[k], o.seed + k);
    StreamCallback on_chunk;
    if (o.max_concurrency > 0) {
      std::unique_lock lk(slots->mu);
      slots->freed.wait(lk, [&] { return slots->in_flight < o.max_concurrency; });
      ++slots->in_flight;
      on_chunk = [slots](const StreamChunk& chunk) {
        if (!chunk.finished) return;
        {
          std::lock_guard done(slots->mu);
          --slots->in_flight;
        }
        slots->freed.notify_one();
      };
    }
    handles.push_back(engine->submit(std::move(r), std::move(on_chunk)));
  }
  std::vector<RequestOutput> outs;
  for (const auto& h : handles) outs.push_back(h->wait());
  report.duration = std::chrono::duration<double>(Clock::now() - start).count();

  int64_t cached = 0;
  std::vector<int64_t> lens;
  for (const RequestOutput& out : outs) lens.push_back(static_cast<int64_t>(out.output_ids.size()));
  report.extra_json["output_lens"] = lens;
  for (const RequestOutput& out : outs) {
    check_ended(out, "request");
    report.add(out.time_to_first_token_s, out.token_times_s, out.latency_s, static_cast<int64_t>(out.prompt_ids.size()),
               static_cast<int64_t>(out.output_ids.size()));
    cached += out.cached_tokens;
  }
  const SchedulerStats stats = engine->stats();
  report.hit_rate = static_cast<double>(cached) / static_cast<double>(report.in_tokens);
  report.prefill_tokens = stats.prefill_tokens - before.prefill_tokens;
  report.retractions = stats.retractions - before.retractions;
  const int64_t prefill_steps = stats.prefill_only_steps - before.prefill_only_steps;
  const double prefill_s = stats.prefill_only_s - before.prefill_only_s;
  report.extra_lines.emplace_back("prefill-only steps (s)", fmt::format("{} ({:.3f})", prefill_steps, prefill_s));
  if (prefill_steps > 0) {
    // Where a prefill step's time goes: a tiny model's steps are mostly fixed cost.
    const double per = 1e3 / static_cast<double>(prefill_steps);
    const double forward = stats.prefill_only_forward_s - before.prefill_only_forward_s;
    const double extend = stats.prefill_only_draft_extend_s - before.prefill_only_draft_extend_s;
    report.extra_lines.emplace_back(
        "ms per prefill-only step: forward",
        fmt::format("{:.3f}  draft extend {:.3f}  other {:.3f}", forward * per, extend * per,
                    (prefill_s - forward - extend) * per));
  }
  report.extra_json["prefill_only_steps"] = prefill_steps;
  report.extra_json["prefill_only_s"] = prefill_s;
  const int64_t deferred = stats.admission_deferred_steps - before.admission_deferred_steps;
  if (deferred > 0) report.extra_lines.emplace_back("admission deferred steps", fmt::format("{}", deferred));
  if (stats.admission_cycle_s > 0) {
    // What the admission groups rested on at the end of the run.
    report.extra_lines.emplace_back(
        "admission group, from",
        fmt::format("{}  fixed part {:.3f} ms  cycle {:.3f} ms  rows freed per cycle {:.2f}", stats.admission_group,
                    stats.admission_fixed_s * 1e3, stats.admission_cycle_s * 1e3,
                    stats.admission_rows_freed_per_cycle));
  }
  report.extra_json["admission_deferred_steps"] = deferred;
  report.extra_json["device"] = o.engine.device;
  if (constrained) {
    report.extra_lines.emplace_back("format", std::string(grammar::kind_name(format.kind)));
    report.extra_lines.emplace_back("mean output tokens per request",
                                    fmt::format("{:.1f}", static_cast<double>(report.out_tokens) / report.completed));
    report.extra_json["format"] = std::string(grammar::kind_name(format.kind));
  }
  if (o.temperature > 0) report.extra_lines.emplace_back("temperature", fmt::format("{}", o.temperature));
  const double accept_mean =
      stats.spec_cycles > 0 ? static_cast<double>(stats.spec_emitted_tokens) / static_cast<double>(stats.spec_cycles) : 0.0;
  if (eo.speculative) {
    const SpecParams& p = eo.speculative->params;
    report.extra_lines.emplace_back(
        "speculative", fmt::format("{} ({}, {}, {})", eagle_kind_name(eo.speculative->kind), p.num_steps, p.topk, p.num_draft_tokens));
    report.extra_lines.emplace_back("mean accept length", fmt::format("{:.3f}", accept_mean));
    report.extra_lines.emplace_back("accept length histogram", fmt::format("{}", fmt::join(stats.spec_accept_histogram, " ")));
    // What the policy ran, per batch size: the share of steps of each shape.
    nlohmann::json choices = nlohmann::json::object();
    for (const auto& [bucket, shapes] : stats.spec_choices) {
      int64_t steps = 0;
      for (const auto& [shape, n] : shapes) steps += n;
      std::vector<std::string> parts;
      for (const auto& [shape, n] : shapes) {
        parts.push_back(fmt::format("{} {:.0f}%", shape, 100.0 * static_cast<double>(n) / static_cast<double>(steps)));
        choices[std::to_string(bucket)][shape] = n;
      }
      report.extra_lines.emplace_back(fmt::format("policy {} at batch <= {}", spec_policy_name(eo.speculative->policy), bucket),
                                      fmt::format("{} ({} steps)", fmt::join(parts, ", "), steps));
    }
    if (stats.spec_catch_ups > 0) {
      report.extra_lines.emplace_back(
          "draft catch-ups", fmt::format("{} ({} missed tokens, {:.3f} s)", stats.spec_catch_ups, stats.spec_catch_up_tokens,
                                         stats.spec_catch_up_s));
    }
    // What the auto policy's choices rested on at the end of the run: each shape's step cost per
    // batch bucket (and how many steps measured it), the catch-up per missed token, and the
    // engine-wide expected tokens of each shape.
    SpecPolicy& policy = engine->speculative_worker()->policy();
    if (policy.kind() == SpecPolicyKind::AUTO) {
      for (const auto& entry : stats.spec_choices) {
        const int bucket = entry.first;
        std::vector<std::string> parts;
        for (const SpecShape& s : policy.shapes()) {
          const std::optional<double> seconds = policy.costs().seconds(bucket, s);
          if (seconds) parts.push_back(fmt::format("{} {:.3f} ms x{}", s.str(), *seconds * 1e3, policy.costs().measured(bucket, s)));
        }
        if (const std::optional<double> c = policy.costs().catch_up_per_token(bucket)) {
          parts.push_back(fmt::format("catch-up {:.3f} ms per missed token", *c * 1e3));
        }
        report.extra_lines.emplace_back(fmt::format("policy costs at batch <= {}", bucket), fmt::format("{}", fmt::join(parts, ", ")));
      }
      std::vector<std::string> expected;
      for (const SpecShape& s : policy.shapes()) {
        expected.push_back(fmt::format("{} {:.2f}", s.str(), policy.acceptance().expected_tokens(s.num_steps)));
      }
      report.extra_lines.emplace_back("policy expected tokens", fmt::format("{}", fmt::join(expected, ", ")));
    }
    const SpecTiming& tm = engine->speculative_worker()->timing();
    const double per = tm.cycles > 0 ? 1e3 / static_cast<double>(tm.cycles) : 0.0;
    report.extra_lines.emplace_back("ms per cycle: draft steps",
                                    fmt::format("{:.3f}  verify {:.3f}  accept {:.3f}  draft extend {:.3f}", tm.draft_steps_s * per,
                                                tm.verify_s * per, tm.accept_s * per, tm.draft_extend_s * per));
    report.extra_json["speculative"] = {{"algorithm", eagle_kind_name(eo.speculative->kind)},
                                        {"num_steps", p.num_steps},
                                        {"topk", p.topk},
                                        {"num_draft_tokens", p.num_draft_tokens},
                                        {"verify_cycles", stats.spec_cycles},
                                        {"accept_length_mean", accept_mean},
                                        {"accept_histogram", stats.spec_accept_histogram},
                                        {"policy", spec_policy_name(eo.speculative->policy)},
                                        {"choices", choices}};
  }
  print_report(o, report);
}

#ifdef SPECULA_HAS_SERVER
// A counter's (or histogram sum's) growth over the run; nullopt when /metrics lacks it.
std::optional<double> metric_diff(const RemoteBenchResult& r, const std::string& name) {
  const auto b = r.metrics_before.find(name), a = r.metrics_after.find(name);
  if (b == r.metrics_before.end() || a == r.metrics_after.end()) return std::nullopt;
  return a->second - b->second;
}

void run_remote(const Options& o) {
  SPECULA_CHECK(o.synthetic.empty() || o.engine.model.empty(), "give at most one of --model and --synthetic");
  SPECULA_CHECK(o.format.given() == 0 && o.tokenizer.empty() && o.temperature == 0,
                "--url: --json-object, --json-schema, --regex, --grammar, --tokenizer and --temperature are for a local "
                "engine");
  for (const CLI::Option* opt : o.engine_flag_options) {
    SPECULA_CHECK(opt->count() == 0 || opt->get_name() == "--model",
                  "--url drives a running server: {} configures a local engine; give it to `specula serve` instead "
                  "(with --url, --model or --synthetic only name the model whose vocabulary and tokenizer build the prompts)",
                  opt->get_name());
  }
  // The server first: a wrong URL fails in a moment, before the prompts are built.
  const RemoteServer server = probe_server(o.url);
  SPECULA_CHECK(server.max_model_len == 0 || o.input_len + o.output_len <= server.max_model_len,
                "--input-len {} + --output-len {} exceed the server's context of {} tokens", o.input_len, o.output_len,
                server.max_model_len);
  // The prompts are the offline mode's: random ids over the vocabulary of the model the server
  // is meant to run (--synthetic, or --model, default the shipped model; only its config.json is
  // read), or windows of the text encoded by its tokenizer.
  int vocab_size = 0;
  std::optional<Tokenizer> tokenizer;
  if (!o.synthetic.empty()) {
    vocab_size = synthetic_config(o.synthetic).vocab_size;
  } else {
    const auto folder = model_folder(o.engine);
    vocab_size = load_model_config(folder).vocab_size;
    if (o.dataset == "text") tokenizer = Tokenizer::from_folder(folder);
  }

  RemoteBenchOptions ro;
  ro.url = o.url;
  ro.model = server.model;
  ro.prompts = make_prompts(o, vocab_size, tokenizer ? &*tokenizer : nullptr);
  ro.send_at_s = arrival_times(o);
  ro.output_len = o.output_len;
  ro.max_concurrency = o.max_concurrency;
  const RemoteBenchResult result = run_remote_bench(ro);

  Report report;
  report.remote = true;
  report.what = server.model;
  report.where = "url=" + o.url;
  report.duration = result.duration_s;
  int64_t text_chunks = 0;
  std::vector<int64_t> lens;  // as the offline report's (0 for a failed request)
  for (size_t k = 0; k < result.requests.size(); ++k) {
    const RemoteRequestResult& q = result.requests[k];
    lens.push_back(q.error.empty() ? q.completion_tokens : 0);
    if (!q.error.empty()) {
      ++report.failed;
      report.errors.push_back(fmt::format("request {}: {}", k, q.error));
      continue;
    }
    report.add(q.ttft_s, q.text_chunk_times_s, q.latency_s, q.prompt_tokens, q.completion_tokens);
    text_chunks += static_cast<int64_t>(q.text_chunk_times_s.size());
  }
  report.extra_lines.emplace_back("SSE chunks with text", fmt::format("{}", text_chunks));
  report.extra_json["output_lens"] = lens;
  report.extra_json["url"] = o.url;
  report.extra_json["text_chunks"] = text_chunks;
  // Engine-side figures from the server's /metrics over the run (other clients' requests
  // included, if there were any).
  const auto prompt = metric_diff(result, "specula_prompt_tokens_total");
  const auto cached = metric_diff(result, "specula_cached_prompt_tokens_total");
  if (prompt && cached && *prompt > 0) report.hit_rate = *cached / *prompt;
  nlohmann::json server_json = nlohmann::json::object();
  const auto mean_of = [&](const std::string& histogram) -> std::optional<double> {
    const auto sum = metric_diff(result, histogram + "_sum"), count = metric_diff(result, histogram + "_count");
    if (!sum || !count || *count <= 0) return std::nullopt;
    return *sum / *count;
  };
  if (const auto v = mean_of("specula_time_to_first_token_seconds")) {
    report.extra_lines.emplace_back("server TTFT ms (mean)", fmt::format("{:.2f}", *v * 1e3));
    server_json["ttft_mean_s"] = *v;
  }
  if (const auto v = mean_of("specula_inter_token_latency_seconds")) {
    report.extra_lines.emplace_back("server ITL ms (mean)", fmt::format("{:.2f}", *v * 1e3));
    server_json["itl_mean_s"] = *v;
  }
  if (const auto v = metric_diff(result, "specula_generation_tokens_total")) server_json["generation_tokens"] = *v;
  const auto prefill_steps = metric_diff(result, "specula_prefill_only_steps_total");
  const auto prefill_s = metric_diff(result, "specula_prefill_only_seconds_total");
  if (prefill_steps && prefill_s) {
    report.extra_lines.emplace_back("prefill-only steps (s)", fmt::format("{:.0f} ({:.3f})", *prefill_steps, *prefill_s));
    report.extra_json["prefill_only_steps"] = static_cast<int64_t>(std::llround(*prefill_steps));
    report.extra_json["prefill_only_s"] = *prefill_s;
  }
  if (const auto deferred = metric_diff(result, "specula_admission_deferred_steps_total")) {
    if (*deferred > 0) report.extra_lines.emplace_back("admission deferred steps", fmt::format("{:.0f}", *deferred));
    report.extra_json["admission_deferred_steps"] = static_cast<int64_t>(std::llround(*deferred));
  }
  if (prompt) server_json["prompt_tokens"] = *prompt;
  if (cached) server_json["cached_prompt_tokens"] = *cached;
  // The accept length gauge is a running mean: emitted tokens = mean x cycles, before and after.
  const auto cycles = metric_diff(result, "specula_spec_verify_cycles_total");
  if (cycles && *cycles > 0 && result.metrics_before.contains("specula_spec_accept_length") &&
      result.metrics_after.contains("specula_spec_accept_length")) {
    const auto emitted = [](const std::map<std::string, double>& m) {
      return m.at("specula_spec_accept_length") * m.at("specula_spec_verify_cycles_total");
    };
    const double accept = (emitted(result.metrics_after) - emitted(result.metrics_before)) / *cycles;
    report.extra_lines.emplace_back("mean accept length", fmt::format("{:.3f}", accept));
    server_json["spec_verify_cycles"] = *cycles;
    server_json["accept_length_mean"] = accept;
    report.extra_json["speculative"] = {{"verify_cycles", *cycles}, {"accept_length_mean", accept}};
  }
  if (!server_json.empty()) report.extra_json["server"] = server_json;
  print_report(o, report);
  SPECULA_CHECK(report.failed == 0, "{} of {} requests failed; first: {}", report.failed, o.num_requests,
                report.errors.front());
}
#endif

void run(const Options& o) {
  check_json_path(o.json_path);
  SPECULA_CHECK(o.num_requests >= 1, "--num-requests {} must be >= 1", o.num_requests);
  SPECULA_CHECK(o.input_len >= 1 && o.output_len >= 1, "--input-len {} and --output-len {} must be >= 1", o.input_len,
                o.output_len);
  SPECULA_CHECK(o.request_rate >= 0, "--request-rate {} must be >= 0 (0: all at once)", o.request_rate);
  SPECULA_CHECK(o.max_concurrency >= 0, "--max-concurrency {} must be >= 0 (0: unlimited)", o.max_concurrency);
  // The arrivals span num_requests / rate seconds on average; a benchmark longer than a day is a
  // mistyped rate, not a measurement.
  constexpr double kMaxArrivalSeconds = 86400;
  const double min_rate = o.num_requests / kMaxArrivalSeconds;
  SPECULA_CHECK(o.request_rate == 0 || o.request_rate >= min_rate,
                "--request-rate {} would spread {} requests over about {:.3g} s; give 0 (all at once) or at least {:.3g} "
                "(a day at most)", o.request_rate, o.num_requests, o.num_requests / o.request_rate, min_rate);
  SPECULA_CHECK(o.warmup_requests >= 0, "--warmup-requests {} must be >= 0", o.warmup_requests);
  SPECULA_CHECK(o.warmup_requests == 0 || o.url.empty(),
                "--warmup-requests {} runs in a local engine; it does not apply with --url", o.warmup_requests);
  // Text prompts are windows at fixed places in the file, whatever the seed: warm-up windows
  // would coincide with timed ones and leave their prefixes cached.
  SPECULA_CHECK(o.warmup_requests == 0 || o.dataset != "text",
                "--warmup-requests {}: not with --dataset text (its windows do not depend on the seed, so warm-up "
                "prompts would be timed prompts too); use random or shared-prefix",
                o.warmup_requests);
  SPECULA_CHECK(o.output_lens_from.empty() || o.url.empty(),
                "--output-lens-from {} sets each request's length in a local engine; it does not apply with --url",
                o.output_lens_from);
  if (o.url.empty()) return run_offline(o);
#ifdef SPECULA_HAS_SERVER
  run_remote(o);
#else
  throw Error("--url is not available in this build: the HTTP client needs cpp-httplib at build time "
              "(Debian/Ubuntu: libcpp-httplib-dev; scripts/setup.sh installs it)");
#endif
}

}  // namespace

void add_bench_serve_command(CLI::App& bench) {
  auto o = std::make_shared<Options>();
  CLI::App* cmd = bench.add_subcommand(
      "serve", "Serving benchmark: many requests through a local engine, or through a running server (--url)");
  const size_t before = cmd->get_options().size();
  add_engine_flags(*cmd, o->engine);
  const auto all = cmd->get_options();
  o->engine_flag_options.assign(all.begin() + static_cast<std::ptrdiff_t>(before), all.end());
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
  cmd->add_option("--max-concurrency", o->max_concurrency,
                  "Requests in flight at most; one that arrives while that many are in flight waits for one to finish "
                  "(0: unlimited)")
      ->capture_default_str();
  cmd->add_option("--url", o->url,
                  "Drive a running `specula serve` (http://HOST:PORT) through POST /v1/completions instead of a local "
                  "engine: the same prompts as token ids, streamed, timed on the client. TTFT: send to the first SSE "
                  "chunk with text; ITL: the gaps between chunks that carry text (a chunk may carry several tokens when "
                  "the server holds text back; output tokens come from the usage chunk). Prefix-cache hit rate, server "
                  "TTFT/ITL and accept length come from GET /metrics before and after. Engine flags are refused; "
                  "--model or --synthetic only name the model whose vocabulary (and tokenizer, for --dataset text) "
                  "build the prompts, as offline. Exits 1 if any request failed");
  cmd->add_option("--json", o->json_path, "Also write the results as JSON to this file");
  add_format_flags(*cmd, o->format);
  cmd->add_option("--tokenizer", o->tokenizer,
                  "With --synthetic: a folder with tokenizer.json, for the grammar of a structured-output format");
  cmd->add_option("--temperature", o->temperature, "Sampling temperature of every request (0: greedy)")
      ->capture_default_str();
  cmd->add_option("--warmup-requests", o->warmup_requests,
                  "Requests run first and not timed, with other prompts and the same format (a grammar's masks "
                  "cached, as a server that keeps serving one schema has them); not with speculation")
      ->capture_default_str();
  cmd->add_option("--output-lens-from", o->output_lens_from,
                  "An earlier run's --json: request k decodes exactly that run's k-th output length (e.g. a run "
                  "without a format doing what a run with one did)");
  cmd->callback([o] { run(*o); });
}

}  // namespace specula
