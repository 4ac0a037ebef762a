// What the scheduler keeps per request (Scheduler::Req): the caller's parameters, sampling and
// output state, and its KV ledger entry. Private to the scheduler's source files.
//
// A request's "fill" is its prompt followed by its output so far; the KV of fill tokens
// [0, kv_len) exists, and the model must still run tokens [kv_len, fill_len) before the next
// token can be sampled: many while prefilling, exactly one (the last output) while decoding.
#pragma once

#include <chrono>
#include <cstdint>
#include <utility>
#include <vector>

#include "specula/runtime/output_text.h"
#include "specula/runtime/request_kv.h"
#include "specula/runtime/scheduler.h"
#include "specula/speculative/spec_policy.h"

namespace specula {

struct Scheduler::Req {
  using Clock = std::chrono::steady_clock;

  Req(uint64_t id_, EngineRequest params_, StreamCallback cb, const Tokenizer* tokenizer)
      : id(id_), params(std::move(params_)), on_chunk(std::move(cb)), sampler(params.sampling),
        text(tokenizer, params.stop_strings) {}

  uint64_t id;
  EngineRequest params;
  StreamCallback on_chunk;
  std::vector<int32_t> stop_ids;
  int max_new_tokens = 0;
  Sampler sampler;
  OutputText text;
  RequestOutput out;
  Clock::time_point submitted = Clock::now();
  size_t streamed_tokens = 0;
  bool admitted_once = false;
  bool done = false;
  RequestKv kv;
  DepthAcceptance acceptance;  // speculative decoding: this request's running acceptance per depth

  FillTokens fill() const { return {params.prompt_ids, out.output_ids}; }
  int kv_len() const { return kv.len(); }
  int fill_len() const { return fill().size(); }
  int pending() const { return fill_len() - kv_len(); }
  int32_t fill_id(int i) const { return fill()[i]; }
  int remaining_new_tokens() const { return max_new_tokens - static_cast<int>(out.output_ids.size()); }
};

}  // namespace specula
