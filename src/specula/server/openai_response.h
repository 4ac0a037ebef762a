// OpenAI API response bodies and Server-Sent Events framing: completions and chat completions,
// whole and streamed (chunks), usage, logprobs in both endpoints' shapes, and the error JSON.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "specula/model/tokenizer.h"
#include "specula/runtime/request.h"

namespace specula::server {

using json = nlohmann::ordered_json;

// A response body as text. Invalid UTF-8 (a logprob token that is part of a character, a
// client's bytes echoed in an error) becomes U+FFFD instead of throwing.
std::string to_text(const json& j);

// {"error": {"message", "type", "param": null, "code"}}.
json error_json(int status, const std::string& message, const std::string& type);

// One SSE event: "data: <json>\n\n"; the stream ends with sse_done().
std::string sse_event(const json& data);
std::string sse_done();

// A random id with OpenAI's prefix ("cmpl-", "chatcmpl-").
std::string make_id(const char* prefix);

// Engine finish reasons to OpenAI's: stop, length; a cancelled request is "abort" (SGLang's).
std::string finish_reason(const std::string& engine_reason);

json usage_json(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens);

// Logprobs of output tokens [first, first + count): completions' {tokens, token_logprobs,
// top_logprobs, text_offset} (offsets counted from text_offset0), chat's {content: [...]}.
json completion_logprobs(const Tokenizer& tokenizer, const std::vector<int32_t>& ids,
                         const std::vector<TokenLogprobs>& logprobs, size_t text_offset0);
json chat_logprobs(const Tokenizer& tokenizer, const std::vector<int32_t>& ids, const std::vector<TokenLogprobs>& logprobs);

// The "object"/"created"/"model" head every response shares.
json response_head(const std::string& id, const char* object, int64_t created, const std::string& model);

}  // namespace specula::server
