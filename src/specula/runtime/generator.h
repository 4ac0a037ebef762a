// Generator: one request at a time through the full engine path (ReqToTokenPool, paged
// allocator, KV pool, attention backend, model, sampler): prefill as an EXTEND step, then one
// DECODE step per token. The serving runtime (continuous batching) replaces it in a later issue.
#pragma once

#include <filesystem>
#include <optional>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "specula/attention/backend.h"
#include "specula/kv/mha_kv_pool.h"
#include "specula/kv/req_to_token_pool.h"
#include "specula/kv/token_allocator.h"
#include "specula/model/llama.h"
#include "specula/model/weights.h"
#include "specula/model/tokenizer.h"
#include "specula/runtime/sampler.h"

namespace specula {

struct GeneratorOptions {
  Device device = Device::cpu();
  std::string attention_backend;  // empty: "cpu" on the CPU, "cuda" on a GPU
  int page_size = 16;
  std::optional<DType> kv_dtype;  // unset: f32 on the CPU, bf16 on a GPU
  int max_context_len = 0;  // 0: the model's max_position_embeddings, at most 8192
};

struct GenerateRequest {
  std::vector<int32_t> prompt_ids;
  SamplingParams sampling;
  int max_new_tokens = 128;
  bool ignore_eos = false;
  std::vector<int32_t> stop_token_ids;  // in addition to the model's EOS ids
  std::vector<std::string> stop_strings;  // generation ends where the text first contains one
};

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

  const ModelConfig& config() const { return model_->config(); }
  const LlamaModel& model() const { return *model_; }
  const Tokenizer& tokenizer() const;

  // on_text (optional) receives the output text as it becomes final: complete UTF-8 only, and
  // never a tail that could still turn out to begin a stop string.
  GenerateResult generate(const GenerateRequest& request, const std::function<void(std::string_view)>& on_text = {});

  // Logits of every prompt position (f32, [prompt_len, vocab]); for tests against reference dumps.
  std::vector<float> prompt_logits(const std::vector<int32_t>& prompt_ids);

 private:
  // Points the batch at this generator's pools, plans the step and runs the model.
  void run_step(ForwardBatch& batch, std::vector<float>& logits, bool all_tokens);

  void init(const ModelConfig& config, const WeightSource& weights);

  GeneratorOptions options_;
  std::unique_ptr<LlamaModel> model_;
  std::shared_ptr<void> cuda_model_;  // LlamaCudaModel in CUDA builds when running on a GPU
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<AttentionBackend> backend_;
  std::unique_ptr<ReqToTokenPool> req_pool_;
  std::unique_ptr<PagedTokenAllocator> allocator_;
  std::unique_ptr<MHAKVPool> kv_pool_;
};

}  // namespace specula
