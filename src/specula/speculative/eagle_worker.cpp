// EagleWorker implementation.
#include "specula/speculative/eagle_worker.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "specula/core/error.h"

namespace specula {

namespace {
double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Each tree token's argmax is all the cycle needs of the target: every request takes the argmax
// (greedy, no penalties) and none asks for logprobs (which need the whole rows).
bool argmax_suffices(std::span<const CycleItem> items) {
  return std::all_of(items.begin(), items.end(), [](const CycleItem& it) {
    return (it.sampler == nullptr || it.sampler->picks_argmax()) && it.logprobs < 0;
  });
}

std::vector<DraftRequest> draft_requests(std::span<const CycleItem> items) {
  std::vector<DraftRequest> requests;
  for (const CycleItem& it : items) requests.push_back({it.req_pool_idx, it.kv_len, it.state});
  return requests;
}

// The batch sizes the cost model keeps costs for: the captured graph sizes (a batch between two
// runs padded to the larger), then powers of two up to the most requests that run at once.
std::vector<int> cost_buckets(const ModelRunner& target) {
  std::vector<int> sizes = target.cuda_graph_batch_sizes();
  const int most = target.options().max_running_requests;
  const int top = sizes.empty() ? 0 : *std::max_element(sizes.begin(), sizes.end());
  for (int bs = 1; bs < most; bs *= 2) {
    if (bs > top) sizes.push_back(bs);
  }
  if (most > top) sizes.push_back(most);
  return sizes;
}
}  // namespace

EagleWorker::EagleWorker(ModelRunner& target, const EagleOptions& options)
    : EagleWorker(target, make_draft_head(target, options), options.params, options.policy) {}

EagleWorker::EagleWorker(ModelRunner& target, std::unique_ptr<DraftHead> head, const SpecParams& params,
                         SpecPolicyKind policy)
    : target_(target), params_(params), head_(std::move(head)), policy_(policy, params, cost_buckets(target)) {
  params_.validate();
  SPECULA_CHECK(head_ != nullptr, "the speculative worker needs a draft head");
  const SpecParams& h = head_->params();
  SPECULA_CHECK(h.num_steps == params_.num_steps && h.topk == params_.topk &&
                    h.num_draft_tokens == params_.num_draft_tokens,
                "the draft head was built for ({}, {}, {}) (num_steps, topk, num_draft_tokens), the worker runs ({}, {}, {})",
                h.num_steps, h.topk, h.num_draft_tokens, params_.num_steps, params_.topk, params_.num_draft_tokens);
  std::vector<int> tokens;
  for (const SpecShape& s : policy_.shapes()) {
    if (!s.off()) tokens.push_back(s.num_draft_tokens);
  }
  target.capture_verify_graphs(head_->capture_layers(), tokens);
}

EagleWorker::~EagleWorker() = default;

void EagleWorker::draft_extend(std::span<DraftExtendItem> items) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<DraftExtendItem*> rest;
  if (extended_.empty()) {
    for (DraftExtendItem& it : items) rest.push_back(&it);
    head_->extend(rest);
    timing_.draft_extend_s += seconds_since(start);
    return;
  }
  // The last cycle's extend already ran on the device for its requests: each item starts where
  // that cycle's KV did and carries the run the device accepted (the host's verification agrees).
  for (DraftExtendItem& it : items) {
    const auto done = std::find_if(extended_.begin(), extended_.end(), [&](const DeviceExtended& e) {
      return e.req_pool_idx == it.req_pool_idx && e.start == it.start;
    });
    if (done != extended_.end() && !it.next_tokens.empty()) {
      SPECULA_CHECK(it.next_tokens.size() == done->tokens,
                    "draft extend of request {}: {} tokens after a cycle whose device extend took {}", it.req_pool_idx,
                    it.next_tokens.size(), done->tokens);
      it.state->on_device = true;
    } else {
      rest.push_back(&it);
    }
  }
  extended_.clear();
  head_->extend(rest);
  timing_.draft_extend_s += seconds_since(start);
}

void EagleWorker::verify(std::span<CycleItem> items, int N, bool tokens_on_device, bool extend_on_device) {
  ForwardBatch b;
  b.forward_mode = ForwardMode::TARGET_VERIFY;
  b.batch_size = static_cast<int>(items.size());
  auto info = std::make_shared<SpecInfo>();
  info->num_draft_tokens = N;
  info->prefix_visible = true;  // a tree over the request's whole KV
  for (const CycleItem& it : items) {
    const int32_t* row = target_.req_pool().row(it.req_pool_idx);
    const std::vector<int32_t> pos = tree_positions(it.tree, it.kv_len);
    b.input_ids.insert(b.input_ids.end(), it.tree.tokens.begin(), it.tree.tokens.end());
    b.positions.insert(b.positions.end(), pos.begin(), pos.end());
    b.out_cache_loc.insert(b.out_cache_loc.end(), row + it.kv_len, row + it.kv_len + N);
    b.req_pool_indices.push_back(it.req_pool_idx);
    b.seq_lens.push_back(it.kv_len);
    append_tree_mask_full(it.tree, it.kv_len, info->custom_mask);
  }
  bool extended = false;
  if (tokens_on_device) {
    info->device_tree_tokens = head_->device_candidate_tokens();
    info->device_tree_pitch = head_->num_candidates();
  }
  if (extend_on_device) {
    info->on_device_results = [this, &extended](const VerifyDeviceResults& r) {
      head_->launch_chain_extend(r);
      extended = true;
    };
  }
  b.spec_info = info;
  HiddenCapture capture;
  capture.layers = head_->capture_layers();
  // The device extend reads the captured states where the verify left them.
  capture.download = !extend_on_device;
  // All-greedy cycles need only each tree token's argmax (on a GPU target, found on the device).
  const bool argmax_only = argmax_suffices(items);
  target_.forward(b, logits_, /*all_tokens=*/true, &capture, argmax_only ? &greedy_ids_ : nullptr);
  if (tokens_on_device) fill_chains(items, N);
  SPECULA_CHECK(extended || capture.download, "the verify ran without the device extend it was prepared for");
  const auto verified = std::chrono::steady_clock::now();
  const auto vocab = static_cast<size_t>(target_.config().vocab_size);
  const auto width = static_cast<size_t>(head_->feature_size());
  std::vector<int32_t> argmax_ids(static_cast<size_t>(N));
  std::vector<float> probs, row_probs;
  std::vector<int32_t> src, dst, path;
  for (size_t i = 0; i < items.size(); ++i) {
    CycleItem& it = items[i];
    const bool adjusts = it.sampler != nullptr && it.sampler->adjusts();
    // Node n's target logits as the sampler sees them: with penalties or a grammar, as if the
    // node's path below the root (the draft tokens it follows, itself included) had been emitted
    // already, which is the context a plain decode step would have had there. A grammar thereby
    // masks each node by its own path (SGLang's traverse_tree / generate_token_bitmask), so a
    // draft token the grammar rejects is never the target's choice and is cut from the tree.
    auto node_path = [&](int n) -> std::span<const int32_t> {
      path.clear();
      for (int32_t a = n; a > 0; a = it.tree.parents[static_cast<size_t>(a)]) path.push_back(it.tree.tokens[static_cast<size_t>(a)]);
      std::reverse(path.begin(), path.end());
      return path;
    };
    auto node_raw = [&](int n) -> std::span<const float> {
      return {logits_.data() + (i * static_cast<size_t>(N) + static_cast<size_t>(n)) * vocab, vocab};
    };
    auto node_logits = [&](int n) -> std::span<const float> {
      return adjusts ? it.sampler->adjusted(node_raw(n), node_path(n)) : node_raw(n);
    };
    it.error.clear();
    try {
      if (it.sampler == nullptr || it.sampler->greedy()) {
        for (int n = 0; n < N; ++n) {
          const size_t row = i * static_cast<size_t>(N) + static_cast<size_t>(n);
          argmax_ids[static_cast<size_t>(n)] = argmax_only ? greedy_ids_[row]
                                               : adjusts   ? it.sampler->greedy_at(node_raw(n), node_path(n))
                                                           : greedy_token(node_raw(n));
        }
        // A row with nothing above -inf has argmax -1, which matches no tree token; only an
        // emitted bonus token of -1 is an error.
        it.result = verify_greedy(it.tree, argmax_ids);
        checked_greedy_token(it.result.bonus_token);
      } else {
        probs.resize(static_cast<size_t>(N) * vocab);
        for (int n = 0; n < N; ++n) {
          it.sampler->distribution(node_logits(n), row_probs);
          std::copy(row_probs.begin(), row_probs.end(), probs.begin() + static_cast<int64_t>(static_cast<size_t>(n) * vocab));
        }
        Sampler* sampler = it.sampler;
        it.result = verify_sampling(it.tree, probs, static_cast<int>(vocab), [sampler] { return sampler->uniform(); });
      }
      it.emitted_logprobs.clear();
      if (it.logprobs >= 0) {
        // Emitted token j follows accepted node j (the root for j = 0): that node's row is the
        // target's distribution it was drawn from, as a plain decode step would have computed it.
        const auto& nodes = it.result.accepted_nodes;
        for (size_t j = 0; j < nodes.size(); ++j) {
          const size_t row = i * static_cast<size_t>(N) + static_cast<size_t>(nodes[j]);
          const int32_t token = j + 1 < nodes.size() ? it.result.accepted_tokens[j] : it.result.bonus_token;
          auto [logprob, top] = log_softmax_at({logits_.data() + row * vocab, vocab}, token, it.logprobs);
          it.emitted_logprobs.push_back({logprob, std::move(top)});
        }
      }
    } catch (const std::exception& e) {
      // A grammar's limits end this request alone; the others of the cycle go on.
      it.error = e.what();
      it.result = VerifyResult{{0}, {}, -1};
      it.emitted_logprobs.clear();
    }
    it.accepted_features.clear();
    const int32_t* row = target_.req_pool().row(it.req_pool_idx);
    for (size_t d = 0; d < it.result.accepted_nodes.size(); ++d) {
      const auto node = static_cast<size_t>(it.result.accepted_nodes[d]);
      if (capture.download) {
        const float* f = capture.data.data() + (i * static_cast<size_t>(N) + node) * width;
        it.accepted_features.insert(it.accepted_features.end(), f, f + width);
      }
      if (node != d) {
        src.push_back(row[it.kv_len + static_cast<int>(node)]);
        dst.push_back(row[it.kv_len + static_cast<int>(d)]);
      }
    }
  }
  // Accepted nodes sit at increasing tree indices no smaller than their depth, so moving them in
  // order never overwrites a source that is still to be read.
  target_.copy_kv_slots(src, dst);
  // Recorded only once every request verified: a cycle that failed part-way leaves none.
  if (extended) {
    for (const CycleItem& it : items) {
      extended_.push_back({it.req_pool_idx, it.kv_len, it.result.accepted_nodes.size()});
    }
  }
  timing_.accept_s += seconds_since(verified);
}

void EagleWorker::fill_chains(std::span<CycleItem> items, int N) {
  std::vector<DraftCandidates> cands;
  head_->read_candidates(cands);
  SPECULA_ASSERT(cands.size() == items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    DraftTree tree = build_tree(items[i].root_token, cands[i], N);
    // The verify ran over the chain's shape with the loop's tokens; a tree of another shape
    // would mean the two disagree.
    SPECULA_ASSERT(tree.parents == items[i].tree.parents);
    items[i].tree = std::move(tree);
  }
}

void EagleWorker::run_device_chain_cycle(std::span<CycleItem> items, const SpecShape& shape) {
  // A chain's shape, positions, mask and slots do not depend on its tokens: the verify is
  // prepared and queued right behind the draft loop and reads the loop's tokens on the device.
  // The host learns the chain's tokens with the verify's results.
  auto start = std::chrono::steady_clock::now();
  const std::vector<DraftRequest> requests = draft_requests(items);
  head_->launch_draft(requests, shape.num_steps);
  timing_.draft_steps_s += seconds_since(start);
  start = std::chrono::steady_clock::now();
  const int N = shape.num_draft_tokens;
  const DraftCandidates chain = chain_candidates(std::vector<int32_t>(static_cast<size_t>(N - 1), 0));
  for (CycleItem& it : items) it.tree = build_tree(it.root_token, chain, N);
  // All-greedy chains also queue the next draft extend right behind the verify: the device
  // finds the accepted run itself, and the head runs while the host handles the results.
  const bool extend_on_device = argmax_suffices(items) && head_->stage_chain_extend(requests, N);
  const double before = timing_.accept_s;
  verify(items, N, /*tokens_on_device=*/true, extend_on_device);
  timing_.verify_s += seconds_since(start) - (timing_.accept_s - before);
  ++timing_.cycles;
}

void EagleWorker::run_cycle(std::span<CycleItem> items, const SpecShape& shape) {
  extended_.clear();
  if (items.empty()) return;
  SPECULA_CHECK(!shape.off(), "a step with speculation off is a plain decode step, not a cycle");
  SPECULA_CHECK(std::find(policy_.shapes().begin(), policy_.shapes().end(), shape) != policy_.shapes().end(),
                "draft shape {} is not one the {} policy runs", shape.str(), spec_policy_name(policy_.kind()));
  const int N = shape.num_draft_tokens;
  if (head_->chains_on_device() && shape.num_steps >= 2) {
    run_device_chain_cycle(items, shape);
    return;
  }
  auto start = std::chrono::steady_clock::now();
  std::vector<DraftCandidates> cands(items.size());
  head_->draft(draft_requests(items), shape.num_steps, cands);
  timing_.draft_steps_s += seconds_since(start);
  start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < items.size(); ++i) items[i].tree = build_tree(items[i].root_token, cands[i], N);
  const double before = timing_.accept_s;
  verify(items, N);
  // verify() books its own tail (verification and KV moves) under accept_s.
  timing_.verify_s += seconds_since(start) - (timing_.accept_s - before);
  ++timing_.cycles;
}

}  // namespace specula
