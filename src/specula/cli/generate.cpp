// `specula generate`.
#include "specula/cli/generate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "specula/core/error.h"
#include "specula/cli/engine_flags.h"
#include "specula/cli/format_flags.h"
#include "specula/runtime/engine.h"

namespace specula {

namespace {

struct Options {
  EngineFlags engine;
  std::vector<std::string> prompts;
  std::string prompts_file;
  std::vector<std::string> prompt_ids;
  int max_new_tokens = 128;
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  uint64_t seed = 0;
  bool ignore_eos = false;
  bool json = false;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  float repetition_penalty = 1.0f;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  FormatFlags format;
};

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    try {
      size_t used = 0;
      const long v = std::stol(item, &used);
      SPECULA_CHECK(used == item.size() && v >= 0 && v <= INT32_MAX, "--prompt-ids: '{}' is not a token id", item);
      ids.push_back(static_cast<int32_t>(v));
    } catch (const std::logic_error&) {
      SPECULA_CHECK(false, "--prompt-ids: '{}' is not a token id", item);
    }
  }
  return ids;
}

// Every prompt given, in order: --prompt texts, then --prompts-file lines, then --prompt-ids.
std::vector<EngineRequest> requests(const Options& o) {
  std::vector<EngineRequest> out;
  EngineRequest base;
  base.max_new_tokens = o.max_new_tokens;
  base.ignore_eos = o.ignore_eos;
  base.sampling.temperature = o.temperature;
  base.sampling.top_k = o.top_k;
  base.sampling.top_p = o.top_p;
  base.sampling.min_p = o.min_p;
  base.sampling.seed = o.seed;
  base.sampling.repetition_penalty = o.repetition_penalty;
  base.sampling.frequency_penalty = o.frequency_penalty;
  base.sampling.presence_penalty = o.presence_penalty;
  base.stop_strings = o.stop;
  base.stop_token_ids = o.stop_token_ids;
  base.format = output_format(o.format);
  for (const std::string& p : o.prompts) {
    SPECULA_CHECK(!p.empty(), "--prompt: the prompt is empty");
    out.push_back(base);
    out.back().prompt = p;
  }
  if (!o.prompts_file.empty()) {
    std::ifstream in(o.prompts_file);
    SPECULA_CHECK(in.good(), "--prompts-file {}: cannot read the file", o.prompts_file);
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      out.push_back(base);
      out.back().prompt = line;
    }
  }
  for (const std::string& ids : o.prompt_ids) {
    out.push_back(base);
    out.back().prompt_ids = parse_ids(ids);
  }
  SPECULA_CHECK(!out.empty(), "no prompt: give --prompt, --prompts-file or --prompt-ids");
  // Sampled requests of one batch get distinct seeds, reproducible from --seed.
  for (size_t i = 0; i < out.size(); ++i) out[i].sampling.seed = o.seed + i;
  return out;
}

double mean_accept_length(const std::vector<int>& histogram) {
  double cycles = 0, tokens = 0;
  for (size_t len = 0; len < histogram.size(); ++len) {
    cycles += histogram[len];
    tokens += static_cast<double>(len) * histogram[len];
  }
  return cycles > 0 ? tokens / cycles : 0.0;
}

void run(const Options& o) {
  std::vector<EngineRequest> batch = requests(o);
  EngineOptions eo = engine_options(o.engine);
  eo.background_thread = false;
  // The whole batch is queued before the first step.
  eo.scheduler.max_queued_requests = std::max<int>(eo.scheduler.max_queued_requests, static_cast<int>(batch.size()));
  Engine engine(model_folder(o.engine), eo);
  // One prompt streams its text as it is produced; a batch prints each result when all are done.
  const bool stream = batch.size() == 1 && !o.json;
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (EngineRequest& r : batch) {
    handles.push_back(engine.submit(std::move(r), [&](const StreamChunk& c) {
      if (!stream) return;
      std::fwrite(c.text.data(), 1, c.text.size(), stdout);
      std::fflush(stdout);
    }));
  }
  engine.run_until_idle();
  for (size_t i = 0; i < handles.size(); ++i) {
    const RequestOutput out = handles[i]->wait();
    SPECULA_CHECK(out.finish_reason.rfind("error: ", 0) != 0, "request {}: {}", i + 1, out.finish_reason.substr(7));
    if (o.json) {
      const double decode_s = out.latency_s - out.time_to_first_token_s;
      nlohmann::json j;
      j["prompt_ids"] = out.prompt_ids;
      j["output_ids"] = out.output_ids;
      j["text"] = out.text;
      j["finish_reason"] = out.finish_reason;
      j["cached_tokens"] = out.cached_tokens;
      j["time_to_first_token_s"] = out.time_to_first_token_s;
      j["decode_tokens_per_s"] = out.output_ids.size() > 1 && decode_s > 0 ? (out.output_ids.size() - 1) / decode_s : 0.0;
      if (eo.speculative) {
        j["spec_verify_cycles"] = out.spec_verify_cycles;
        j["spec_accept_length_mean"] = mean_accept_length(out.spec_accept_histogram);
        j["spec_accept_histogram"] = out.spec_accept_histogram;
      }
      fmt::print("{}\n", j.dump());
    } else if (stream) {
      fmt::print("\n");
    } else {
      fmt::print("=== request {} ({} tokens, {}) ===\n{}\n", i + 1, out.output_ids.size(), out.finish_reason, out.text);
    }
  }
  if (eo.speculative) {
    const SchedulerStats s = engine.stats();
    const SpecParams& p = eo.speculative->params;
    const double mean = s.spec_cycles > 0 ? static_cast<double>(s.spec_emitted_tokens) / static_cast<double>(s.spec_cycles) : 0.0;
    if (o.json) {
      nlohmann::json j;
      j["speculative"] = {{"algorithm", eagle_kind_name(eo.speculative->kind)},
                          {"draft_model", eo.speculative->draft_model.string()},
                          {"num_steps", p.num_steps},
                          {"topk", p.topk},
                          {"num_draft_tokens", p.num_draft_tokens},
                          {"verify_cycles", s.spec_cycles},
                          {"accept_length_mean", mean},
                          {"accept_histogram", s.spec_accept_histogram}};
      fmt::print("{}\n", j.dump());
    } else {
      std::fflush(stdout);  // the streamed text ends before the summary line
      fmt::print(stderr, "speculative {} ({}, {}, {}): mean accept length {:.2f} over {} verify cycles\n",
                 eagle_kind_name(eo.speculative->kind), p.num_steps, p.topk, p.num_draft_tokens, mean, s.spec_cycles);
    }
  }
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("generate", "Generate text with a model");
  add_engine_flags(*cmd, o->engine);
  cmd->add_option("--prompt", o->prompts, "Prompt text (repeat for a batch)");
  cmd->add_option("--prompts-file", o->prompts_file, "A file with one prompt per line, run as one batch");
  cmd->add_option("--prompt-ids", o->prompt_ids, "Prompt token ids, comma-separated (repeatable)");
  cmd->add_option("--max-new-tokens", o->max_new_tokens, "Tokens to generate at most")->capture_default_str();
  cmd->add_option("--temperature", o->temperature, "0 is greedy")->capture_default_str();
  cmd->add_option("--top-k", o->top_k, "Keep the k most likely tokens (0: all)")->capture_default_str();
  cmd->add_option("--top-p", o->top_p, "Nucleus sampling threshold")->capture_default_str();
  cmd->add_option("--min-p", o->min_p, "Drop tokens below min_p x the top probability")->capture_default_str();
  cmd->add_option("--seed", o->seed, "Sampling seed")->capture_default_str();
  cmd->add_flag("--ignore-eos", o->ignore_eos, "Keep generating past the end-of-sequence token");
  cmd->add_option("--stop", o->stop, "Stop when the text contains this string (repeatable)");
  cmd->add_option("--stop-token-ids", o->stop_token_ids, "Stop at these token ids")->delimiter(',');
  cmd->add_option("--repetition-penalty", o->repetition_penalty, "> 1 discourages repeating prompt/output tokens")
      ->capture_default_str();
  cmd->add_option("--frequency-penalty", o->frequency_penalty, "Per-occurrence penalty on output tokens")
      ->capture_default_str();
  cmd->add_option("--presence-penalty", o->presence_penalty, "Penalty on tokens already in the output")
      ->capture_default_str();
  add_format_flags(*cmd, o->format);
  cmd->add_flag("--json", o->json, "Print one JSON object per request (one per line) instead of text");
  cmd->callback([o] { run(*o); });
}

}  // namespace specula
