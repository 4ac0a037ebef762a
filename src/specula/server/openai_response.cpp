// OpenAI response shapes.
#include "specula/server/openai_response.h"

#include <fmt/format.h>

#include <random>

namespace specula::server {

namespace {

// Token text for logprobs: the token's bytes, lossy as UTF-8 (a partial byte token becomes
// U+FFFD, as OpenAI shows it; the exact bytes are in "bytes").
std::string token_text(const Tokenizer& tokenizer, int32_t id) {
  const std::vector<int32_t> one{id};
  return tokenizer.decode(one, /*skip_special_tokens=*/false);
}

json byte_array(const std::string& bytes) {
  json a = json::array();
  for (unsigned char b : bytes) a.push_back(static_cast<int>(b));
  return a;
}

}  // namespace

std::string to_text(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json error_json(int status, const std::string& message, const std::string& type) {
  return {{"error", {{"message", message}, {"type", type}, {"param", nullptr}, {"code", status}}}};
}

std::string sse_event(const json& data) { return "data: " + to_text(data) + "\n\n"; }

std::string sse_done() { return "data: [DONE]\n\n"; }

std::string make_id(const char* prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}{:016x}{:016x}", prefix, rng(), rng());
}

std::string finish_reason(const std::string& engine_reason) {
  if (engine_reason == "stop" || engine_reason == "length") return engine_reason;
  return "abort";
}

json usage_json(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

json completion_logprobs(const Tokenizer& tokenizer, const std::vector<int32_t>& ids,
                         const std::vector<TokenLogprobs>& logprobs, size_t text_offset0) {
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(), offsets = json::array();
  size_t offset = text_offset0;
  for (size_t i = 0; i < ids.size() && i < logprobs.size(); ++i) {
    const std::string text = token_text(tokenizer, ids[i]);
    tokens.push_back(text);
    token_logprobs.push_back(logprobs[i].logprob);
    json alternatives = json::object();
    for (const auto& [id, lp] : logprobs[i].top) alternatives[token_text(tokenizer, id)] = lp;
    top.push_back(std::move(alternatives));
    offsets.push_back(offset);
    offset += text.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top}, {"text_offset", offsets}};
}

json chat_logprobs(const Tokenizer& tokenizer, const std::vector<int32_t>& ids, const std::vector<TokenLogprobs>& logprobs) {
  json content = json::array();
  for (size_t i = 0; i < ids.size() && i < logprobs.size(); ++i) {
    json top = json::array();
    for (const auto& [id, lp] : logprobs[i].top) {
      top.push_back({{"token", token_text(tokenizer, id)}, {"logprob", lp}, {"bytes", byte_array(tokenizer.token_raw_bytes(id))}});
    }
    content.push_back({{"token", token_text(tokenizer, ids[i])},
                       {"logprob", logprobs[i].logprob},
                       {"bytes", byte_array(tokenizer.token_raw_bytes(ids[i]))},
                       {"top_logprobs", std::move(top)}});
  }
  return {{"content", std::move(content)}};
}

json response_head(const std::string& id, const char* object, int64_t created, const std::string& model) {
  return {{"id", id}, {"object", object}, {"created", created}, {"model", model}};
}

}  // namespace specula::server
