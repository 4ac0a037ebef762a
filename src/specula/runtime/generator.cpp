// Generator implementation.
#include "specula/runtime/generator.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "specula/core/error.h"
#include "specula/model/safetensors.h"
#ifdef SPECULA_HAS_CUDA
#include "specula/model/llama_cuda.h"
#endif

namespace specula {

Generator::Generator(const std::filesystem::path& model_dir, const GeneratorOptions& options) : options_(options) {
  SPECULA_CHECK(std::filesystem::is_directory(model_dir), "model folder '{}' does not exist", model_dir.string());
  const ModelConfig config = load_model_config(model_dir);
  tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::from_file(model_dir / "tokenizer.json"));
  // The checkpoint's mapping is released once the model holds its own copy of the weights.
  const Checkpoint checkpoint(model_dir);
  init(config, checkpoint);
}

Generator::Generator(const ModelConfig& config, const WeightSource& weights, const GeneratorOptions& options)
    : options_(options) {
  init(config, weights);
}

const Tokenizer& Generator::tokenizer() const {
  SPECULA_CHECK(tokenizer_ != nullptr, "this generator was built without a tokenizer");
  return *tokenizer_;
}

void Generator::init(const ModelConfig& config, const WeightSource& weights) {
  const bool gpu = options_.device.is_cuda();
  SPECULA_CHECK(!gpu || cuda_available(), "--device {}: this build or machine has no CUDA device", options_.device.str());
  if (options_.attention_backend.empty()) options_.attention_backend = gpu ? "cuda" : "cpu";
  if (!options_.kv_dtype) options_.kv_dtype = gpu ? DType::bf16 : DType::f32;
  model_ = std::make_unique<LlamaModel>(config, weights);
#ifdef SPECULA_HAS_CUDA
  if (gpu) cuda_model_ = std::make_shared<LlamaCudaModel>(*model_, options_.device);
#endif
  SPECULA_CHECK(options_.page_size >= 1, "page_size {} is not valid; it must be a power of two >= 1", options_.page_size);
  SPECULA_CHECK(options_.max_context_len >= 0, "max_context_len {} is not valid", options_.max_context_len);
  // Default: the model's context, capped at 8192 tokens so a long-context model's cache fits in
  // memory (--max-context-len raises it).
  if (options_.max_context_len == 0) options_.max_context_len = std::min(config.max_position_embeddings, 8192);
  SPECULA_CHECK(options_.max_context_len <= config.max_position_embeddings,
                "max_context_len {} exceeds the model's max_position_embeddings {}", options_.max_context_len,
                config.max_position_embeddings);

  AttentionBackendOptions bo;
  bo.device = options_.device;
  bo.page_size = options_.page_size;
  bo.max_context_len = options_.max_context_len;
  backend_ = make_attention_backend(options_.attention_backend, bo);
  // The CPU path attends with f32 queries; the GPU path with bf16 ones.
  for (const AttentionLayer& layer : model_->attention_layers()) {
    backend_->check_layer(layer, gpu ? DType::bf16 : DType::f32, *options_.kv_dtype);
  }

  // One request at a time: its whole context, rounded up to pages.
  const int64_t capacity = (options_.max_context_len + options_.page_size - 1) / options_.page_size * options_.page_size;
  allocator_ = std::make_unique<PagedTokenAllocator>(capacity, options_.page_size);
  req_pool_ = std::make_unique<ReqToTokenPool>(1, options_.max_context_len);
  kv_pool_ = std::make_unique<MHAKVPool>(KVPoolConfig{allocator_->total_slots(), config.num_hidden_layers,
                                                      config.num_key_value_heads, config.head_dim, config.head_dim,
                                                      *options_.kv_dtype, options_.device});
}

void Generator::run_step(ForwardBatch& batch, std::vector<float>& logits, bool all_tokens) {
  batch.req_to_token_pool = req_pool_.get();
  batch.token_to_kv_pool = kv_pool_.get();
  backend_->init_forward_metadata(batch);
#ifdef SPECULA_HAS_CUDA
  if (cuda_model_) {
    static_cast<LlamaCudaModel*>(cuda_model_.get())->forward(batch, *backend_, logits, all_tokens);
    return;
  }
#endif
  model_->forward(batch, *backend_, logits, all_tokens);
}

namespace {
// Frees a request's slot and KV pages however generation ends.
struct RequestGuard {
  ReqToTokenPool& req_pool;
  PagedTokenAllocator& allocator;
  int32_t slot;
  std::vector<int32_t> kv_slots;
  ~RequestGuard() {
    if (!kv_slots.empty()) allocator.free(kv_slots);
    req_pool.free(slot);
  }
};

ForwardBatch prefill_batch(const std::vector<int32_t>& ids, int32_t slot, const std::vector<int32_t>& kv_slots) {
  ForwardBatch b;
  b.forward_mode = ForwardMode::EXTEND;
  b.batch_size = 1;
  b.input_ids = ids;
  for (size_t i = 0; i < ids.size(); ++i) b.positions.push_back(static_cast<int32_t>(i));
  b.req_pool_indices = {slot};
  b.seq_lens = {static_cast<int32_t>(ids.size())};
  b.extend_prefix_lens = {0};
  b.extend_seq_lens = {static_cast<int32_t>(ids.size())};
  b.out_cache_loc = kv_slots;
  return b;
}
}  // namespace

std::vector<float> Generator::prompt_logits(const std::vector<int32_t>& prompt_ids) {
  SPECULA_CHECK(!prompt_ids.empty() && static_cast<int>(prompt_ids.size()) <= options_.max_context_len,
                "prompt of {} tokens; it must have 1 to {} tokens", prompt_ids.size(), options_.max_context_len);
  RequestGuard guard{*req_pool_, *allocator_, req_pool_->alloc(1).value().at(0), {}};
  const auto n = static_cast<int32_t>(prompt_ids.size());
  auto slots = allocator_->alloc_extend(std::vector<int32_t>{0}, std::vector<int32_t>{n}, std::vector<int32_t>{-1});
  SPECULA_CHECK(slots.has_value(), "the KV cache cannot hold {} tokens", n);
  guard.kv_slots = *slots;
  req_pool_->write(guard.slot, 0, *slots);
  ForwardBatch batch = prefill_batch(prompt_ids, guard.slot, *slots);
  std::vector<float> logits;
  run_step(batch, logits, true);
  return logits;
}

GenerateResult Generator::generate(const GenerateRequest& request, const std::function<void(std::string_view)>& on_text) {
  const ModelConfig& c = model_->config();
  const auto prompt_len = static_cast<int32_t>(request.prompt_ids.size());
  SPECULA_CHECK(prompt_len >= 1, "the prompt is empty");
  SPECULA_CHECK(prompt_len < options_.max_context_len, "the prompt has {} tokens; the context holds {}", prompt_len,
                options_.max_context_len);
  SPECULA_CHECK(request.max_new_tokens >= 0, "max_new_tokens {} is not valid", request.max_new_tokens);
  for (int32_t id : request.prompt_ids) {
    SPECULA_CHECK(id >= 0 && id < c.vocab_size, "prompt token id {} is out of range [0, {})", id, c.vocab_size);
  }
  Sampler sampler(request.sampling);
  sampler.observe_prompt(request.prompt_ids);
  size_t longest_stop = 0;
  for (const std::string& s : request.stop_strings) {
    SPECULA_CHECK(!s.empty(), "stop strings must not be empty");
    longest_stop = std::max(longest_stop, s.size());
  }
  SPECULA_CHECK(tokenizer_ != nullptr || request.stop_strings.empty(), "stop strings need a tokenizer");
  std::optional<Tokenizer::Stream> stream;
  if (tokenizer_) stream.emplace(*tokenizer_, /*continuing=*/true);  // the output continues the prompt
  size_t emitted = 0;  // bytes of result.text already passed to on_text
  // Passes on the text that can no longer change: all of it at the end, otherwise all but the
  // last (longest stop - 1) bytes, backed up to a UTF-8 character boundary.
  auto emit = [&](GenerateResult& r, bool final) {
    size_t safe = r.text.size();
    if (!final && longest_stop > 1) {
      safe = r.text.size() > longest_stop - 1 ? r.text.size() - (longest_stop - 1) : 0;
      while (safe > emitted && safe < r.text.size() && (static_cast<unsigned char>(r.text[safe]) & 0xC0) == 0x80) --safe;
    }
    if (safe > emitted) {
      if (on_text) on_text(std::string_view(r.text).substr(emitted, safe - emitted));
      emitted = safe;
    }
  };
  std::vector<int32_t> stop_ids = request.stop_token_ids;
  if (!request.ignore_eos) stop_ids.insert(stop_ids.end(), c.eos_token_ids.begin(), c.eos_token_ids.end());

  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  RequestGuard guard{*req_pool_, *allocator_, req_pool_->alloc(1).value().at(0), {}};
  auto slots = allocator_->alloc_extend(std::vector<int32_t>{0}, std::vector<int32_t>{prompt_len}, std::vector<int32_t>{-1});
  SPECULA_CHECK(slots.has_value(), "the KV cache cannot hold the {}-token prompt", prompt_len);
  guard.kv_slots = *slots;
  req_pool_->write(guard.slot, 0, *slots);

  GenerateResult result;
  result.finish_reason = "length";
  const int max_new = std::min(request.max_new_tokens, options_.max_context_len - prompt_len);
  if (max_new == 0) return result;
  // Cuts the text before the first stop string that ends after byte `before`; true if one did.
  bool cut_by_stop_string = false;
  auto find_stop = [&](size_t before) {
    if (longest_stop == 0) return false;
    const size_t from = before > longest_stop ? before - longest_stop : 0;
    size_t cut = std::string::npos;
    for (const std::string& s : request.stop_strings) cut = std::min(cut, result.text.find(s, from));
    if (cut == std::string::npos) return false;
    result.text.resize(cut);
    cut_by_stop_string = true;
    return true;
  };
  // Appends a token's text; true when a stop string now appears.
  auto add_text = [&](int32_t token) {
    const size_t before = result.text.size();
    if (stream) result.text += stream->push(token);
    return find_stop(before);
  };
  ForwardBatch batch = prefill_batch(request.prompt_ids, guard.slot, *slots);
  std::vector<float> logits;
  run_step(batch, logits, false);
  int32_t seq_len = prompt_len;
  auto decode_start = clock::now();
  for (int step = 0; step < max_new; ++step) {
    const int32_t token = sampler.sample(logits);
    result.output_ids.push_back(token);
    if (step == 0) {
      result.time_to_first_token_s = std::chrono::duration<double>(clock::now() - start).count();
      decode_start = clock::now();
    }
    // A stop token ends the output without adding its text (as SGLang trims it).
    if (std::find(stop_ids.begin(), stop_ids.end(), token) != stop_ids.end()) {
      result.finish_reason = "stop";
      break;
    }
    if (add_text(token)) {
      result.finish_reason = "stop";
      break;
    }
    emit(result, false);
    if (step + 1 == max_new) break;
    // The new token goes into the cache at position seq_len.
    auto slot = allocator_->alloc_decode(std::vector<int32_t>{seq_len + 1}, std::vector<int32_t>{guard.kv_slots.back()});
    SPECULA_CHECK(slot.has_value(), "the KV cache is full at {} tokens", seq_len);
    guard.kv_slots.push_back((*slot)[0]);
    req_pool_->write(guard.slot, seq_len, *slot);
    ForwardBatch d;
    d.forward_mode = ForwardMode::DECODE;
    d.batch_size = 1;
    d.input_ids = {token};
    d.positions = {seq_len};
    d.req_pool_indices = {guard.slot};
    d.seq_lens = {seq_len + 1};
    d.out_cache_loc = {(*slot)[0]};
    run_step(d, logits, false);
    ++seq_len;
  }
  const size_t before_tail = result.text.size();
  if (!cut_by_stop_string) {
    // Bytes the stream still holds (an incomplete character) become text now; the stop strings
    // are checked once more over them.
    if (stream) result.text += stream->finish();
    if (find_stop(before_tail)) result.finish_reason = "stop";
  }
  emit(result, true);
  const double decode_s = std::chrono::duration<double>(clock::now() - decode_start).count();
  if (result.output_ids.size() > 1 && decode_s > 0) {
    result.decode_tokens_per_s = static_cast<double>(result.output_ids.size() - 1) / decode_s;
  }
  return result;
}

}  // namespace specula
