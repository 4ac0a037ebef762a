// `specula generate`.
#include "specula/cli/generate.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "specula/core/error.h"
#include "specula/runtime/generator.h"

namespace specula {

namespace {

struct Options {
  std::string model;
  std::string prompt;
  std::string prompt_ids;
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
  std::string device = "cpu";
  std::string attention_backend;
  int page_size = 16;
  int max_context_len = 0;
  std::string kv_cache_dtype = "auto";
};

// The shipped model: next to the working directory, next to the binary (build/<preset>/bin), or
// in the source tree this binary was built from.
std::filesystem::path default_model() {
  const std::filesystem::path name = std::filesystem::path("models") / "specula-byte-6m";
  std::vector<std::filesystem::path> candidates = {std::filesystem::current_path() / name};
  char exe[4096];
  const ssize_t len = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (len > 0) {
    exe[len] = '\0';
    const auto bin = std::filesystem::path(exe).parent_path();
    candidates.push_back(bin / ".." / ".." / ".." / name);
    candidates.push_back(bin / ".." / name);
  }
  candidates.push_back(std::filesystem::path(SPECULA_SOURCE_DIR) / name);
  for (const auto& c : candidates) {
    if (std::filesystem::exists(c / "config.json")) return std::filesystem::weakly_canonical(c);
  }
  SPECULA_CHECK(false, "no --model given and the shipped model {} was not found", name.string());
  return {};
}

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

void run(const Options& o) {
  SPECULA_CHECK(o.prompt.empty() != o.prompt_ids.empty(), "give exactly one of --prompt and --prompt-ids");
  GeneratorOptions go;
  go.device = parse_device(o.device);
  go.attention_backend = o.attention_backend;
  go.page_size = o.page_size;
  go.max_context_len = o.max_context_len;
  if (o.kv_cache_dtype != "auto") go.kv_dtype = parse_dtype(o.kv_cache_dtype);
  const std::filesystem::path model = o.model.empty() ? default_model() : std::filesystem::path(o.model);
  Generator generator(model, go);

  GenerateRequest request;
  request.prompt_ids = o.prompt_ids.empty() ? generator.tokenizer().encode(o.prompt) : parse_ids(o.prompt_ids);
  request.max_new_tokens = o.max_new_tokens;
  request.ignore_eos = o.ignore_eos;
  request.sampling.temperature = o.temperature;
  request.sampling.top_k = o.top_k;
  request.sampling.top_p = o.top_p;
  request.sampling.min_p = o.min_p;
  request.sampling.seed = o.seed;

  request.stop_strings = o.stop;
  request.stop_token_ids = o.stop_token_ids;
  request.sampling.repetition_penalty = o.repetition_penalty;
  request.sampling.frequency_penalty = o.frequency_penalty;
  request.sampling.presence_penalty = o.presence_penalty;
  const GenerateResult result = generator.generate(request, [&](std::string_view text) {
    if (o.json) return;
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  });
  if (o.json) {
    nlohmann::json j;
    j["prompt_ids"] = request.prompt_ids;
    j["output_ids"] = result.output_ids;
    j["text"] = result.text;
    j["finish_reason"] = result.finish_reason;
    j["time_to_first_token_s"] = result.time_to_first_token_s;
    j["decode_tokens_per_s"] = result.decode_tokens_per_s;
    fmt::print("{}\n", j.dump());
  } else {
    fmt::print("\n");
  }
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("generate", "Generate text with a model");
  cmd->add_option("--model", o->model, "Hugging Face model folder (default: the shipped models/specula-byte-6m)");
  cmd->add_option("--prompt", o->prompt, "Prompt text");
  cmd->add_option("--prompt-ids", o->prompt_ids, "Prompt token ids, comma-separated");
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
  cmd->add_flag("--json", o->json, "Print one JSON object instead of streaming text");
  cmd->add_option("--device", o->device, "cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--attention-backend", o->attention_backend, "Attention backend (default: cpu, or cuda on a GPU)");
  cmd->add_option("--page-size", o->page_size, "KV cache page size")->capture_default_str();
  cmd->add_option("--max-context-len", o->max_context_len,
                  "Tokens of context to allocate KV cache for (default: the model's, at most 8192)");
  cmd->add_option("--kv-cache-dtype", o->kv_cache_dtype, "auto (f32 on the CPU, bf16 on a GPU), f32, bf16, f16 or fp8_e4m3")
      ->capture_default_str();
  cmd->callback([o] { run(*o); });
}

}  // namespace specula
