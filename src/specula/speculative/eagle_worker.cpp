// EagleWorker implementation.
#include "specula/speculative/eagle_worker.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "specula/core/error.h"
#ifdef SPECULA_HAS_CUDA
#include "specula/speculative/eagle_cuda_head.h"
#else
namespace specula {
// Builds without CUDA never create a GPU head; the worker's destructor still needs the type.
class EagleCudaHead {};
}  // namespace specula
#endif

namespace specula {

namespace {
double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Every request of the cycle takes the target's argmax (greedy, no penalties).
bool all_pick_argmax(std::span<const CycleItem> items) {
  return std::all_of(items.begin(), items.end(),
                     [](const CycleItem& it) { return it.sampler == nullptr || it.sampler->picks_argmax(); });
}
#ifdef SPECULA_HAS_CUDA
// The GPU head's draft-loop inputs of the items (their roots are in its store).
std::vector<DraftLoopInput> loop_inputs(std::span<const CycleItem> items, ReqToTokenPool& req_pool) {
  std::vector<DraftLoopInput> inputs;
  for (const CycleItem& it : items) {
    SPECULA_ASSERT(it.state->on_device);
    inputs.push_back({it.kv_len, req_pool.row(it.req_pool_idx), it.req_pool_idx});
  }
  return inputs;
}
#endif
}  // namespace

EagleWorker::EagleWorker(ModelRunner& target, const EagleOptions& options) : target_(target), options_(options) {
  const SpecParams& p = options_.params;
  p.validate();
  head_ = std::make_unique<EagleHead>(options_.draft_model, options_.kind, target.model());
  const AttentionLayer& layer = head_->attention_layer();
  const Device device = target.options().device;
  const DType kv_dtype = device.is_cuda() ? DType::bf16 : DType::f32;
  draft_kv_ = std::make_unique<MHAKVPool>(KVPoolConfig{target.kv_pool().num_slots(), 1, layer.num_kv_heads,
                                                       layer.head_dim, layer.head_dim, kv_dtype, device});
  AttentionBackendOptions bo;
  bo.device = device;
  bo.page_size = target.page_size();
  bo.max_context_len = target.kv_capacity();
  bo.cuda_stream = target.cuda_stream();
  extend_backend_ = make_attention_backend(device.is_cuda() ? "cuda" : "cpu", bo);
  extend_backend_->check_layer(layer, kv_dtype, kv_dtype);
  if (device.is_cuda()) {
#ifdef SPECULA_HAS_CUDA
    EagleCudaHeadOptions ho;
    ho.page_size = target.page_size();
    ho.max_context_len = target.kv_capacity();
    ho.max_batch = target.options().max_running_requests;
    ho.num_req_rows = target.req_pool().size();
    ho.graph_batch_sizes = target.cuda_graph_batch_sizes();
    ho.padding_slot = target.cuda_graph_padding_slot();
    cuda_head_ = std::make_unique<EagleCudaHead>(*head_, p, *draft_kv_, target.cuda_stream(), ho);
#endif
  } else {
    step_backend_ = std::make_unique<DraftCascadeBackend>("cpu", bo, target.options().max_running_requests * p.topk,
                                                          p.num_steps);
    step_backend_->check_layer(layer, DType::f32, DType::f32);
  }
  target.capture_verify_graphs(head_->capture_layers());
}

EagleWorker::~EagleWorker() = default;

int EagleWorker::scratch_tokens() const { return options_.params.scratch_tokens(); }

void EagleWorker::top_k(const float* logits, std::vector<int32_t>& tokens, std::vector<float>& probs) const {
  const int vocab = head_->draft_vocab_size();
  const float top = *std::max_element(logits, logits + vocab);
  std::vector<float> p(static_cast<size_t>(vocab));
  double sum = 0;
  for (int i = 0; i < vocab; ++i) sum += p[static_cast<size_t>(i)] = std::exp(logits[i] - top);
  for (float& x : p) x = static_cast<float>(x / sum);
  const std::vector<int32_t> best = top_k_indices(p, options_.params.topk);
  tokens.clear();
  probs.clear();
  for (int32_t id : best) {
    tokens.push_back(head_->to_target_id(id));
    probs.push_back(p[static_cast<size_t>(id)]);
  }
}

void EagleWorker::draft_extend(std::span<DraftExtendItem> items) {
  if (extended_.empty()) {
    extend_now(items);
    return;
  }
  // The last cycle's extend already ran on the device for its requests: each item starts where
  // that cycle's KV did and carries the run the device accepted (the host's verification agrees).
  std::vector<DraftExtendItem> rest;
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
      rest.push_back(std::move(it));
    }
  }
  extended_.clear();
  extend_now(rest);
}

void EagleWorker::extend_now(std::span<DraftExtendItem> items) {
  const auto start = std::chrono::steady_clock::now();
#ifdef SPECULA_HAS_CUDA
  if (cuda_head_) {
    // After a cycle (at most num_draft_tokens pairs per request): the captured graph, launched
    // and not waited for; the roots stay in the head's root store.
    std::vector<DraftExtendInput> inputs;
    std::vector<DraftExtendItem*> used;
    for (DraftExtendItem& it : items) {
      if (it.next_tokens.empty()) continue;
      SPECULA_CHECK(it.features != nullptr, "draft extend of request {}: no target features", it.req_pool_idx);
      inputs.push_back({it.start, static_cast<int>(it.next_tokens.size()), it.req_pool_idx,
                        target_.req_pool().row(it.req_pool_idx), it.next_tokens.data(), it.features});
      used.push_back(&it);
    }
    if (used.empty()) return;
    if (cuda_head_->extend_after_cycle(inputs)) {
      for (DraftExtendItem* it : used) it->state->on_device = true;
      timing_.draft_extend_s += seconds_since(start);
      return;
    }
  }
#endif
  ForwardBatch b;
  b.forward_mode = ForwardMode::DRAFT_EXTEND;
  std::vector<float> features;
  std::vector<int64_t> last_rows;
  std::vector<DraftExtendItem*> used;
  const auto width = static_cast<size_t>(head_->feature_size());
  for (DraftExtendItem& it : items) {
    const auto len = static_cast<int>(it.next_tokens.size());
    if (len == 0) continue;
    const int32_t* row = target_.req_pool().row(it.req_pool_idx);
    for (int i = 0; i < len; ++i) {
      b.input_ids.push_back(it.next_tokens[static_cast<size_t>(i)]);
      b.positions.push_back(it.start + i);
      b.out_cache_loc.push_back(row[it.start + i]);
    }
    features.insert(features.end(), it.features, it.features + static_cast<size_t>(len) * width);
    b.req_pool_indices.push_back(it.req_pool_idx);
    b.seq_lens.push_back(it.start + len);
    b.extend_prefix_lens.push_back(it.start);
    b.extend_seq_lens.push_back(len);
    last_rows.push_back(static_cast<int64_t>(b.input_ids.size()) - 1);
    used.push_back(&it);
  }
  if (used.empty()) return;
  b.batch_size = static_cast<int>(used.size());
  b.req_to_token_pool = &target_.req_pool();
  b.token_to_kv_pool = draft_kv_.get();
  extend_backend_->init_forward_metadata(b);
  const auto h = static_cast<size_t>(head_->hidden_size());
#ifdef SPECULA_HAS_CUDA
  if (cuda_head_) {
    const std::vector<int32_t> rows(last_rows.begin(), last_rows.end());
    cuda_head_->extend(b, *extend_backend_, features.data(), rows, b.req_pool_indices);
    for (DraftExtendItem* it : used) it->state->on_device = true;
    timing_.draft_extend_s += seconds_since(start);
    return;
  }
#endif
  std::vector<float> hidden;
  head_->forward(b, *extend_backend_, features.data(), /*from_target=*/true, hidden, last_rows, logits_);
  const auto vocab = static_cast<size_t>(head_->draft_vocab_size());
  for (size_t i = 0; i < used.size(); ++i) {
    DraftState& s = *used[i]->state;
    const auto row = static_cast<size_t>(last_rows[i]);
    s.root_hidden.assign(hidden.begin() + static_cast<int64_t>(row * h), hidden.begin() + static_cast<int64_t>((row + 1) * h));
    top_k(logits_.data() + i * vocab, s.root_tokens, s.root_probs);
  }
  timing_.draft_extend_s += seconds_since(start);
}

DraftState EagleWorker::root_on_host(int32_t req_pool_idx, const DraftState& state) const {
  if (!state.on_device) return state;
  DraftState out;
#ifdef SPECULA_HAS_CUDA
  cuda_head_->read_root(req_pool_idx, out.root_hidden, out.root_tokens, out.root_probs);
#else
  (void)req_pool_idx;
#endif
  return out;
}

void EagleWorker::draft_steps(std::span<CycleItem> items, std::vector<DraftCandidates>& cands) {
#ifdef SPECULA_HAS_CUDA
  if (cuda_head_) {
    cuda_head_->draft_loop(loop_inputs(items, target_.req_pool()), cands);
    return;
  }
#endif
  const SpecParams& p = options_.params;
  const int K = p.topk;
  const size_t B = items.size();
  const auto h = static_cast<size_t>(head_->hidden_size());
  cands.assign(B, {});
  std::vector<std::vector<int32_t>> frontier(B);
  std::vector<std::vector<int32_t>> slot_of(B);  // KV slot of each expanded candidate, -1 otherwise
  std::vector<float> frontier_hidden(B * static_cast<size_t>(K) * h);
  for (size_t b = 0; b < B; ++b) {
    const DraftState& s = *items[b].state;
    SPECULA_ASSERT(s.valid() && static_cast<int>(s.root_tokens.size()) == K);
    for (int j = 0; j < K; ++j) {
      cands[b].tokens.push_back(s.root_tokens[static_cast<size_t>(j)]);
      cands[b].parents.push_back(-1);
      cands[b].scores.push_back(s.root_probs[static_cast<size_t>(j)]);
      cands[b].depths.push_back(1);
      frontier[b].push_back(j);
      std::copy(s.root_hidden.begin(), s.root_hidden.end(), frontier_hidden.begin() + static_cast<int64_t>((b * K + j) * h));
    }
  }
  const auto vocab = static_cast<size_t>(head_->draft_vocab_size());
  std::vector<float> hidden;
  std::vector<int64_t> rows_all(B * static_cast<size_t>(K));
  for (size_t r = 0; r < rows_all.size(); ++r) rows_all[r] = static_cast<int64_t>(r);
  std::vector<int32_t> tokens;
  std::vector<float> probs;
  for (int step = 1; step < p.num_steps; ++step) {
    ForwardBatch b;
    b.forward_mode = ForwardMode::DECODE;
    b.batch_size = static_cast<int>(B) * K;
    auto info = std::make_shared<DraftStepInfo>();
    for (size_t r = 0; r < B; ++r) {
      const CycleItem& it = items[r];
      const int32_t* row = target_.req_pool().row(it.req_pool_idx);
      slot_of[r].resize(cands[r].tokens.size(), -1);
      for (int j = 0; j < K; ++j) {
        const int32_t f = frontier[r][static_cast<size_t>(j)];
        const int32_t own = row[it.kv_len + (step - 1) * K + j];
        slot_of[r][static_cast<size_t>(f)] = own;
        b.input_ids.push_back(cands[r].tokens[static_cast<size_t>(f)]);
        b.positions.push_back(it.kv_len - 1 + cands[r].depths[static_cast<size_t>(f)]);
        b.out_cache_loc.push_back(own);
        b.req_pool_indices.push_back(it.req_pool_idx);
        b.seq_lens.push_back(it.kv_len);
        // The branch: ancestors below the root, root side first, then the node.
        std::vector<int32_t> branch;
        for (int32_t a = cands[r].parents[static_cast<size_t>(f)]; a >= 0; a = cands[r].parents[static_cast<size_t>(a)]) {
          SPECULA_ASSERT(slot_of[r][static_cast<size_t>(a)] >= 0);
          branch.push_back(slot_of[r][static_cast<size_t>(a)]);
        }
        std::reverse(branch.begin(), branch.end());
        branch.push_back(own);
        info->prefix_req_pool_indices.push_back(it.req_pool_idx);
        info->prefix_lens.push_back(it.kv_len);
        info->branch_lens.push_back(static_cast<int32_t>(branch.size()));
        info->branch_slots.insert(info->branch_slots.end(), branch.begin(), branch.end());
      }
    }
    b.spec_info = info;
    b.req_to_token_pool = &target_.req_pool();
    b.token_to_kv_pool = draft_kv_.get();
    step_backend_->init_forward_metadata(b);
    head_->forward(b, *step_backend_, frontier_hidden.data(), /*from_target=*/false, hidden, rows_all, logits_);
    for (size_t r = 0; r < B; ++r) {
      DraftCandidates& c = cands[r];
      const auto first_child = static_cast<int32_t>(c.tokens.size());
      std::vector<int32_t> child_row;  // the step row (parent) of each new child
      for (int j = 0; j < K; ++j) {
        const size_t row = r * static_cast<size_t>(K) + static_cast<size_t>(j);
        const int32_t f = frontier[r][static_cast<size_t>(j)];
        top_k(logits_.data() + row * vocab, tokens, probs);
        for (int t = 0; t < K; ++t) {
          c.tokens.push_back(tokens[static_cast<size_t>(t)]);
          c.parents.push_back(f);
          c.scores.push_back(c.scores[static_cast<size_t>(f)] * probs[static_cast<size_t>(t)]);
          c.depths.push_back(c.depths[static_cast<size_t>(f)] + 1);
          child_row.push_back(static_cast<int32_t>(row));
        }
      }
      const std::span<const float> child_scores(c.scores.data() + first_child, c.scores.size() - static_cast<size_t>(first_child));
      const std::vector<int32_t> best = top_k_indices(child_scores, K);
      for (int j = 0; j < K; ++j) {
        const int32_t local = best[static_cast<size_t>(j)];
        frontier[r][static_cast<size_t>(j)] = first_child + local;
        const auto src = static_cast<size_t>(child_row[static_cast<size_t>(local)]);
        std::copy_n(hidden.begin() + static_cast<int64_t>(src * h), h,
                    frontier_hidden.begin() + static_cast<int64_t>((r * K + static_cast<size_t>(j)) * h));
      }
    }
  }
}

void EagleWorker::verify(std::span<CycleItem> items, bool tokens_on_device, bool extend_on_device) {
  const int N = options_.params.num_draft_tokens;
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
#ifdef SPECULA_HAS_CUDA
  if (tokens_on_device) {
    info->device_tree_tokens = cuda_head_->candidate_tokens();
    info->device_tree_pitch = cuda_head_->num_candidates();
  }
  if (extend_on_device) {
    info->on_device_results = [this, &extended](const VerifyDeviceResults& r) {
      cuda_head_->launch_chain_extend(r);
      extended = true;
    };
  }
#endif
  b.spec_info = info;
  HiddenCapture capture;
  capture.layers = head_->capture_layers();
  // The device extend reads the captured states where the verify left them.
  capture.download = !extend_on_device;
  // All-greedy cycles need only each tree token's argmax (on a GPU target, found on the device).
  const bool argmax_only = all_pick_argmax(items);
  target_.forward(b, logits_, /*all_tokens=*/true, &capture, argmax_only ? &greedy_ids_ : nullptr);
  if (tokens_on_device) fill_chains(items);
  SPECULA_CHECK(extended || capture.download, "the verify ran without the device extend it was prepared for");
  const auto verified = std::chrono::steady_clock::now();
  const auto vocab = static_cast<size_t>(target_.config().vocab_size);
  const auto width = static_cast<size_t>(head_->feature_size());
  std::vector<int32_t> argmax_ids(static_cast<size_t>(N));
  std::vector<float> probs, row_probs;
  std::vector<int32_t> src, dst;
  for (size_t i = 0; i < items.size(); ++i) {
    CycleItem& it = items[i];
    if (it.sampler == nullptr || it.sampler->greedy()) {
      for (int n = 0; n < N; ++n) {
        const size_t row = i * static_cast<size_t>(N) + static_cast<size_t>(n);
        argmax_ids[static_cast<size_t>(n)] =
            argmax_only ? greedy_ids_[row] : greedy_token({logits_.data() + row * vocab, vocab});
      }
      // A row with nothing above -inf has argmax -1, which matches no tree token; only an
      // emitted bonus token of -1 is an error.
      it.result = verify_greedy(it.tree, argmax_ids);
      checked_greedy_token(it.result.bonus_token);
    } else {
      const float* logits = logits_.data() + i * static_cast<size_t>(N) * vocab;
      probs.resize(static_cast<size_t>(N) * vocab);
      for (int n = 0; n < N; ++n) {
        it.sampler->distribution({logits + static_cast<size_t>(n) * vocab, vocab}, row_probs);
        std::copy(row_probs.begin(), row_probs.end(), probs.begin() + static_cast<int64_t>(static_cast<size_t>(n) * vocab));
      }
      Sampler* sampler = it.sampler;
      it.result = verify_sampling(it.tree, probs, static_cast<int>(vocab), [sampler] { return sampler->uniform(); });
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
  target_.kv_pool().copy_slots(src, dst, target_.cuda_stream());
  // Recorded only once every request verified: a cycle that failed part-way leaves none.
  if (extended) {
    for (const CycleItem& it : items) {
      extended_.push_back({it.req_pool_idx, it.kv_len, it.result.accepted_nodes.size()});
    }
  }
  timing_.accept_s += seconds_since(verified);
}

bool EagleWorker::chain_on_device() const {
  const SpecParams& p = options_.params;
  return cuda_head_ != nullptr && p.topk == 1 && p.num_steps >= 2;
}

void EagleWorker::fill_chains(std::span<CycleItem> items) {
#ifdef SPECULA_HAS_CUDA
  std::vector<DraftCandidates> cands;
  cuda_head_->read_draft_candidates(cands);
  SPECULA_ASSERT(cands.size() == items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    DraftTree tree = build_tree(items[i].root_token, cands[i], options_.params.num_draft_tokens);
    // The verify ran over the chain's shape with the loop's tokens; a tree of another shape
    // would mean the two disagree.
    SPECULA_ASSERT(tree.parents == items[i].tree.parents);
    items[i].tree = std::move(tree);
  }
#else
  (void)items;
#endif
}

void EagleWorker::run_cycle(std::span<CycleItem> items) {
  extended_.clear();
  if (items.empty()) return;
  auto start = std::chrono::steady_clock::now();
  if (chain_on_device()) {
#ifdef SPECULA_HAS_CUDA
    // A chain's shape, positions, mask and slots do not depend on its tokens: the verify is
    // prepared and queued right behind the draft loop and reads the loop's tokens on the device.
    // The host learns the chain's tokens with the verify's results.
    const std::vector<DraftLoopInput> inputs = loop_inputs(items, target_.req_pool());
    cuda_head_->launch_draft_loop(inputs);
    timing_.draft_steps_s += seconds_since(start);
    start = std::chrono::steady_clock::now();
    const int N = options_.params.num_draft_tokens;
    const DraftCandidates shape = chain_candidates(std::vector<int32_t>(static_cast<size_t>(N - 1), 0));
    for (CycleItem& it : items) it.tree = build_tree(it.root_token, shape, N);
    // All-greedy chains also queue the next draft extend right behind the verify: the device
    // finds the accepted run itself, and the head runs while the host handles the results.
    const bool extend_on_device = all_pick_argmax(items) && cuda_head_->stage_chain_extend(inputs);
    const double before = timing_.accept_s;
    verify(items, /*tokens_on_device=*/true, extend_on_device);
    timing_.verify_s += seconds_since(start) - (timing_.accept_s - before);
    ++timing_.cycles;
    return;
#endif
  }
  std::vector<DraftCandidates> cands;
  draft_steps(items, cands);
  timing_.draft_steps_s += seconds_since(start);
  start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < items.size(); ++i) {
    items[i].tree = build_tree(items[i].root_token, cands[i], options_.params.num_draft_tokens);
  }
  const double before = timing_.accept_s;
  verify(items);
  // verify() books its own tail (verification and KV moves) under accept_s.
  timing_.verify_s += seconds_since(start) - (timing_.accept_s - before);
  ++timing_.cycles;
}

}  // namespace specula
