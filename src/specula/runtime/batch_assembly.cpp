// Batch assembly (scheduler.h): turns a step's plan (requests and how many of their tokens run,
// whose KV slots are allocated already) into a ForwardBatch, runs the model over it, and samples
// each request's next token from its row of logits. Requests whose prefill is not finished only
// hand their new KV to the prefix cache.
#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "specula/core/error.h"
#include "specula/core/thread_pool.h"
#include "specula/runtime/scheduled_request.h"
#include "specula/runtime/scheduler.h"

namespace specula {

ForwardBatch Scheduler::assemble_batch(const std::vector<Planned>& plan, ForwardMode mode) {
  ForwardBatch b;
  b.forward_mode = mode;
  b.batch_size = static_cast<int>(plan.size());
  for (const Planned& p : plan) {
    const Req& r = *p.req;
    const int start = r.kv_len() - p.extend;  // the step's tokens are the last p.extend of its KV
    for (int i = start; i < r.kv_len(); ++i) {
      b.input_ids.push_back(r.fill_id(i));
      b.positions.push_back(i);
      b.out_cache_loc.push_back(r.kv.slots[static_cast<size_t>(i)]);
    }
    b.req_pool_indices.push_back(r.kv.req_pool_idx);
    b.seq_lens.push_back(r.kv_len());
    if (mode != ForwardMode::DECODE) {
      b.extend_prefix_lens.push_back(start);
      b.extend_seq_lens.push_back(p.extend);
    }
    if (p.extend > 1 || r.out.output_ids.empty()) stats_.prefill_tokens += p.extend;
  }
  return b;
}

bool Scheduler::run_batch(const std::vector<Planned>& plan, ForwardMode mode) {
  ForwardBatch b = assemble_batch(plan, mode);
  // Prefill chunks under speculation capture what the draft head reads; decode steps (speculation
  // off) capture nothing and run as plain decoding does.
  const bool drafting = spec_ != nullptr && mode != ForwardMode::DECODE;
  HiddenCapture capture;
  if (drafting) capture.layers = spec_->capture_layers();
  // Greedy requests without penalties need only each row's argmax: found where the logits are
  // (on a GPU, one id per row is downloaded instead of the vocabulary's logits). With a grammar,
  // the argmax over the tokens it allows, whose masks the host fills while a GPU runs the step.
  const bool argmax_only = std::all_of(plan.begin(), plan.end(), [](const Planned& p) {
    const Sampler& s = p.req->sampler;
    return (s.picks_argmax() || s.picks_masked_argmax()) && p.req->params.logprobs < 0;
  });
  const bool masked = argmax_only && std::any_of(plan.begin(), plan.end(), [](const Planned& p) {
    return p.req->sampler.picks_masked_argmax() && p.req->pending() == 0;
  });
  TokenBitmaskFill fill_masks;
  // A grammar whose mask hits a limit ends its own request after the step, not the batch's.
  std::vector<std::string> mask_errors;
  if (masked) {
    mask_errors.resize(plan.size());
    // Rows on the process's worker threads, which a GPU step leaves idle (and a CPU step has
    // finished with by the time its masks are asked for): a step that meets several grammar
    // states never classified waits for the slowest row instead of their sum. Rows of one grammar
    // share its masker, which is thread-safe.
    fill_masks = [&plan, &mask_errors](std::span<uint32_t> words) {
      const size_t per_row = words.size() / plan.size();
      default_thread_pool().parallel_for(static_cast<int64_t>(plan.size()), [&](int64_t k, int) {
        const auto i = static_cast<size_t>(k);
        const std::span<uint32_t> row = words.subspan(i * per_row, per_row);
        Req& r = *plan[i].req;
        std::fill(row.begin(), row.end(), ~0u);
        if (!r.sampler.picks_masked_argmax() || r.pending() > 0) return;
        try {
          r.sampler.fill_token_bitmask(row);
        } catch (const std::exception& e) {
          mask_errors[i] = e.what();
          std::fill(row.begin(), row.end(), ~0u);
        }
      });
    };
  }
  // Rows drawn at temperature > 0 under a grammar: their masks filled while a GPU runs the step,
  // so that after it only the mask's pass over the row and the draw remain (draw_rows).
  std::vector<size_t> premasked;
  for (size_t i = 0; i < plan.size() && !argmax_only; ++i) {
    const Req& r = *plan[i].req;
    if (r.pending() == 0 && !r.sampler.greedy() && r.sampler.constrained()) premasked.push_back(i);
  }
  std::function<void()> premask;
  if (!premasked.empty()) {
    premask = [&plan, &premasked, vocab = runner_.config().vocab_size] {
      default_thread_pool().parallel_for(static_cast<int64_t>(premasked.size()), [&](int64_t k, int) {
        plan[premasked[static_cast<size_t>(k)]].req->sampler.premask(vocab);
      });
    };
  }
  batch_forward_s_ = 0;
  batch_draft_extend_s_ = 0;
  const auto forward_start = std::chrono::steady_clock::now();
  try {
    runner_.forward(b, logits_, /*all_tokens=*/false, drafting ? &capture : nullptr, argmax_only ? &greedy_ids_ : nullptr,
                    fill_masks, premask);
    batch_forward_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - forward_start).count();
  } catch (const std::exception& e) {
    // A failed step ends its requests with the reason rather than losing them silently; the KV
    // it was writing is not cached.
    for (const Planned& p : plan) finish(*p.req, std::string("error: ") + e.what(), /*cache_kv=*/false);
    return false;
  }
  const auto vocab = static_cast<size_t>(runner_.config().vocab_size);
  draw_rows(plan, argmax_only, vocab);
  for (size_t i = 0; i < plan.size(); ++i) {
    Req& r = *plan[i].req;
    try {
      // With speculation a chunk is cached only after the draft head's extend over it.
      if (r.pending() > 0) {
        if (spec_ == nullptr) kv_.cache_unfinished(r.kv, r.fill());
        continue;
      }
      SPECULA_CHECK(mask_errors.empty() || mask_errors[i].empty(), "{}", mask_errors[i]);
      const std::span<const float> row = argmax_only ? std::span<const float>()
                                                     : std::span<const float>(logits_).subspan(i * vocab, vocab);
      SPECULA_CHECK(drawn_[i].error.empty(), "{}", drawn_[i].error);
      int32_t token = 0;
      if (drawn_[i].token >= 0) {
        token = drawn_[i].token;
        r.sampler.commit(token);
      } else {
        token = !argmax_only                         ? r.sampler.sample(row)
                : r.sampler.picks_masked_argmax() ? r.sampler.take_masked_argmax(greedy_ids_[i])
                                                  : r.sampler.take_argmax(greedy_ids_[i]);
      }
      if (r.params.logprobs >= 0) {
        auto [logprob, top] = log_softmax_at(row, token, r.params.logprobs);
        r.out.logprobs.push_back({logprob, std::move(top)});
      }
      if (plan[i].extend > 1 && spec_ == nullptr) kv_.cache_unfinished(r.kv, r.fill());
      process_token(r, token);
    } catch (const std::exception& e) {
      // E.g. logits that are all NaN: this request ends, the others go on.
      if (!r.done) finish(r, std::string("error: ") + e.what(), /*cache_kv=*/false);
    }
  }
  if (drafting) {
    const auto extend_start = std::chrono::steady_clock::now();
    draft_after_prefill(plan, capture);
    batch_draft_extend_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - extend_start).count();
  }
  return true;
}

void Scheduler::draw_rows(const std::vector<Planned>& plan, bool argmax_only, size_t vocab) {
  drawn_.assign(plan.size(), Drawn{});
  if (argmax_only) return;
  // Rows drawn at temperature > 0, each on its own request's sampler and on the thread pool: its
  // penalties, its grammar's mask (rows of one grammar share the grammar's masker, which is
  // thread-safe, so a step that meets several grammar states never classified waits for the
  // slowest row, not their sum) and its draw (a softmax over the vocabulary).
  std::vector<size_t> rows;
  for (size_t i = 0; i < plan.size(); ++i) {
    const Req& r = *plan[i].req;
    if (r.pending() == 0 && !r.sampler.greedy()) rows.push_back(i);
  }
  if (rows.empty()) return;
  auto draw = [&](int64_t k, int) {
    const size_t i = rows[static_cast<size_t>(k)];
    Sampler& sampler = plan[i].req->sampler;
    try {
      drawn_[i].token = sampler.draw(sampler.prepare(std::span<const float>(logits_).subspan(i * vocab, vocab)));
    } catch (const std::exception& e) {
      drawn_[i].error = e.what();
    }
  };
  if (rows.size() == 1) {
    draw(0, 0);
  } else {
    default_thread_pool().parallel_for(static_cast<int64_t>(rows.size()), draw);
  }
}

}  // namespace specula
