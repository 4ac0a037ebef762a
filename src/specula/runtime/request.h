// What a caller hands the engine (EngineRequest), what it streams back while the request runs
// (StreamChunk) and what it reports at the end (RequestOutput).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "specula/grammar/output_format.h"
#include "specula/runner/sampler.h"

namespace specula {

struct EngineRequest {
  std::vector<int32_t> prompt_ids;  // when empty, `prompt` is encoded with the model's tokenizer
  std::string prompt;
  SamplingParams sampling;
  int max_new_tokens = 128;  // cut further so that prompt + output fit the context
  bool ignore_eos = false;
  std::vector<int32_t> stop_token_ids;   // in addition to the model's EOS ids
  std::vector<std::string> stop_strings;  // generation ends where the text first contains one
  // -1: none; N in [0, kMaxTopLogprobs]: each output token's log-probability under the model (the
  // log-softmax of its raw logits) and the N most likely tokens' (OpenAI's logprobs / top_logprobs).
  int logprobs = -1;
  // Structured output: what the output must match (a JSON object, a JSON schema, a regular
  // expression or a GBNF grammar); compiled when the request is validated. The request stops
  // when the grammar admits nothing more.
  grammar::OutputFormat format;
};

constexpr int kMaxTopLogprobs = 20;

struct RequestOutput {
  uint64_t id = 0;
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> output_ids;
  std::string text;  // decoded output, cut before a stop string
  // "stop" (EOS, stop token or stop string), "length", "cancelled", or "error: <message>".
  std::string finish_reason;
  int cached_tokens = 0;  // prompt tokens whose KV came from the prefix cache (first admission)
  int retractions = 0;    // times the request was pushed back out of a full KV cache
  double time_to_first_token_s = 0;  // from submission
  double latency_s = 0;              // from submission to the last token
  std::vector<double> token_times_s;  // from submission, one per output token
  // Speculative decoding: verify cycles and how many tokens each produced ([L] = cycles that
  // produced L tokens: L - 1 accepted draft tokens and the bonus token).
  int spec_verify_cycles = 0;
  std::vector<int> spec_accept_histogram;
  std::vector<TokenLogprobs> logprobs;  // one per output token when the request asked for them
};

// Sent as a request makes progress: the tokens since the last chunk and the text that became
// final with them (stop strings may hold text back for a while). The last chunk has finished set
// and carries the whole output.
struct StreamChunk {
  uint64_t id = 0;
  std::vector<int32_t> token_ids;
  std::vector<TokenLogprobs> logprobs;  // one per token of token_ids when the request asked for them
  std::string text;
  bool finished = false;
  const RequestOutput* output = nullptr;  // the finished request; valid during the callback only
};

using StreamCallback = std::function<void(const StreamChunk&)>;

}  // namespace specula
