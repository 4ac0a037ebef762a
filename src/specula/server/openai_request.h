// OpenAI API request bodies (/v1/completions, /v1/chat/completions, /tokenize, /detokenize) parsed
// and checked into plain structs. Field names and meanings are OpenAI's, plus SGLang's / vLLM's
// sampling extensions (top_k, min_p, repetition_penalty, ignore_eos, stop_token_ids,
// chat_template_kwargs). Unknown fields are ignored, as OpenAI does; a field of the wrong type or
// out of range is an HttpError 400 naming the field and the value.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "specula/grammar/output_format.h"
#include "specula/runner/sampler.h"

namespace specula::server {

// An error answered with `status` and OpenAI's error JSON.
class HttpError : public std::runtime_error {
 public:
  HttpError(int status, const std::string& message, std::string type = "invalid_request_error")
      : std::runtime_error(message), status(status), type(std::move(type)) {}
  int status;
  std::string type;
};

// Generation limits of one HTTP request.
constexpr int kMaxChoices = 64;       // n
constexpr int kMaxStopStrings = 16;   // OpenAI allows 4
constexpr int kMaxPrompts = 1024;     // prompts of one /v1/completions request

struct GenerationRequest {
  bool chat = false;
  std::string model;  // empty: not given
  // /v1/completions: each prompt as text, or as token ids (prompt_is_ids).
  std::vector<std::string> prompt_texts;
  std::vector<std::vector<int32_t>> prompt_ids;
  bool prompt_is_ids = false;
  // /v1/chat/completions: [{role, content: string}, ...] (text parts joined), ready for a template.
  nlohmann::ordered_json messages;
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();  // tools, chat_template_kwargs
  bool add_generation_prompt = true;

  int n = 1;
  std::optional<int> max_tokens;  // max_tokens, or max_completion_tokens (chat)
  SamplingParams sampling;
  bool seeded = false;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  int logprobs = -1;  // top-N alternatives per token; -1: no logprobs
  bool echo = false;  // completions: the prompt text before the output
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  grammar::OutputFormat format;  // response_format, regex, ebnf, json_schema (compiled)
};

GenerationRequest parse_completion_request(const std::string& body);
GenerationRequest parse_chat_request(const std::string& body);

// /tokenize: {"prompt": text} or {"messages": [...]} (rendered with the chat template), with
// add_special_tokens (default true for prompt). /detokenize: {"tokens": [ids]}.
struct TokenizeRequest {
  std::optional<std::string> prompt;
  nlohmann::ordered_json messages;  // when prompt is absent
  bool add_special_tokens = true;
  bool add_generation_prompt = true;
};
TokenizeRequest parse_tokenize_request(const std::string& body);
std::vector<int32_t> parse_detokenize_request(const std::string& body);

}  // namespace specula::server
