// Generator: one request at a time, synchronously, through the Engine (scheduler, prefix cache,
// paged KV, attention backend, model, sampler). For tests, `bench generate` and simple callers;
// batches of requests go through the Engine directly.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "specula/model/tokenizer.h"
#include "specula/model/weights.h"
#include "specula/runtime/engine.h"
#include "specula/runner/sampler.h"

namespace specula {

// The model runner's options; max_running_requests is ignored (one request at a time).
using GeneratorOptions = ModelRunnerOptions;
using GenerateRequest = EngineRequest;

struct GenerateResult {
  std::vector<int32_t> output_ids;
  std::string text;           // decoded output, cut before a stop string
  std::string finish_reason;  // "stop" (EOS / stop token / stop string) or "length"
  double time_to_first_token_s = 0;
  double decode_tokens_per_s = 0;
};

class Generator {
 public:
  Generator(const std::filesystem::path& model_dir, const GeneratorOptions& options);
  // A model from any weight source and no tokenizer (benchmarks: ids in, ids out; the result's
  // text stays empty and stop strings are refused).
  Generator(const ModelConfig& config, const WeightSource& weights, const GeneratorOptions& options);

  const ModelConfig& config() const { return engine_->config(); }
  ModelRunner& runner() { return engine_->runner(); }
  const Tokenizer& tokenizer() const;

  // on_text (optional) receives the output text as it becomes final: complete UTF-8 only, and
  // never a tail that could still turn out to begin a stop string. Errors in the request throw
  // specula::Error.
  GenerateResult generate(const GenerateRequest& request, const std::function<void(std::string_view)>& on_text = {});

  // Logits of every prompt position (f32, [prompt_len, vocab]); for tests against reference dumps.
  std::vector<float> prompt_logits(const std::vector<int32_t>& prompt_ids);
  // The greedy next token after every prompt position (ModelRunner::forward's greedy_ids: found
  // where the logits are, -1 where a row holds nothing above -inf).
  std::vector<int32_t> prompt_greedy_ids(const std::vector<int32_t>& prompt_ids);

 private:
  // One EXTEND forward of the prompt over every position, into logits or greedy_ids.
  void prompt_forward(const std::vector<int32_t>& prompt_ids, std::vector<float>& logits,
                      std::vector<int32_t>* greedy_ids);
  static EngineOptions engine_options(const GeneratorOptions& options);
  std::unique_ptr<Engine> engine_;
};

}  // namespace specula
