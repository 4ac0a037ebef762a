// Generator implementation: an Engine without a background thread, driven to completion per call.
#include "specula/runtime/generator.h"

#include "specula/core/error.h"

namespace specula {

EngineOptions Generator::engine_options(const GeneratorOptions& options) {
  EngineOptions e;
  e.background_thread = false;
  e.runner = options;
  // One request at a time: one request row and one context of KV.
  e.runner.max_running_requests = 1;
  // Each call stands alone (benchmarks time whole prefills), so nothing is cached across calls.
  e.scheduler.disable_radix_cache = true;
  e.scheduler.log_retractions = false;
  return e;
}

Generator::Generator(const std::filesystem::path& model_dir, const GeneratorOptions& options)
    : engine_(std::make_unique<Engine>(model_dir, engine_options(options))) {}

Generator::Generator(const ModelConfig& config, const WeightSource& weights, const GeneratorOptions& options)
    : engine_(std::make_unique<Engine>(config, weights, engine_options(options))) {}

const Tokenizer& Generator::tokenizer() const {
  SPECULA_CHECK(engine_->tokenizer() != nullptr, "this generator was built without a tokenizer");
  return *engine_->tokenizer();
}

GenerateResult Generator::generate(const GenerateRequest& request, const std::function<void(std::string_view)>& on_text) {
  auto handle = engine_->submit(request, [&](const StreamChunk& chunk) {
    if (on_text && !chunk.text.empty()) on_text(chunk.text);
  });
  engine_->run_until_idle();
  const RequestOutput out = handle->wait();
  SPECULA_CHECK(out.finish_reason.rfind("error: ", 0) != 0, "{}", out.finish_reason.substr(7));
  GenerateResult result;
  result.output_ids = out.output_ids;
  result.text = out.text;
  result.finish_reason = out.finish_reason;
  result.time_to_first_token_s = out.time_to_first_token_s;
  const double decode_s = out.latency_s - out.time_to_first_token_s;
  if (out.output_ids.size() > 1 && decode_s > 0) {
    result.decode_tokens_per_s = static_cast<double>(out.output_ids.size() - 1) / decode_s;
  }
  return result;
}

std::vector<float> Generator::prompt_logits(const std::vector<int32_t>& prompt_ids) {
  std::vector<float> logits;
  prompt_forward(prompt_ids, logits, nullptr);
  return logits;
}

std::vector<int32_t> Generator::prompt_greedy_ids(const std::vector<int32_t>& prompt_ids) {
  std::vector<float> logits;
  std::vector<int32_t> ids;
  prompt_forward(prompt_ids, logits, &ids);
  return ids;
}

void Generator::prompt_forward(const std::vector<int32_t>& prompt_ids, std::vector<float>& logits,
                               std::vector<int32_t>* greedy_ids) {
  ModelRunner& runner = engine_->runner();
  SPECULA_CHECK(!prompt_ids.empty() && static_cast<int>(prompt_ids.size()) <= runner.max_context_len(),
                "prompt of {} tokens; it must have 1 to {} tokens", prompt_ids.size(), runner.max_context_len());
  // The engine is idle between calls and caches nothing, so its pools are free to borrow.
  const auto n = static_cast<int32_t>(prompt_ids.size());
  const int32_t slot = runner.req_pool().alloc(1).value().at(0);
  auto slots = runner.allocator().alloc_extend(std::vector<int32_t>{0}, std::vector<int32_t>{n}, std::vector<int32_t>{-1});
  SPECULA_CHECK(slots.has_value(), "the KV cache cannot hold {} tokens", n);
  struct Release {
    ModelRunner& runner;
    int32_t slot;
    const std::vector<int32_t>& kv;
    ~Release() {
      runner.allocator().free(kv);
      runner.req_pool().free(slot);
    }
  } release{runner, slot, *slots};
  runner.req_pool().write(slot, 0, *slots);
  ForwardBatch b;
  b.forward_mode = ForwardMode::EXTEND;
  b.batch_size = 1;
  b.input_ids = prompt_ids;
  for (int32_t i = 0; i < n; ++i) b.positions.push_back(i);
  b.req_pool_indices = {slot};
  b.seq_lens = {n};
  b.extend_prefix_lens = {0};
  b.extend_seq_lens = {n};
  b.out_cache_loc = *slots;
  runner.forward(b, logits, true, nullptr, greedy_ids);
}

}  // namespace specula
