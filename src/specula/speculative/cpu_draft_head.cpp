// CpuDraftHead: the head's extend and its tree expansion on the host.
#include "specula/speculative/cpu_draft_head.h"

#include <algorithm>
#include <cmath>

#include "specula/core/error.h"
#include "specula/runner/model_runner.h"

namespace specula {

CpuDraftHead::CpuDraftHead(ModelRunner& target, const EagleOptions& options) : target_(target), params_(options.params) {
  DraftHeadParts parts = load_draft_head(target, options, DType::f32);
  head_ = std::move(parts.head);
  draft_kv_ = std::move(parts.draft_kv);
  const AttentionBackendOptions& bo = parts.backend_options;
  const AttentionLayer& layer = head_->attention_layer();
  extend_backend_ = make_attention_backend("cpu", bo);
  extend_backend_->check_layer(layer, DType::f32, DType::f32);
  step_backend_ = std::make_unique<DraftCascadeBackend>("cpu", bo, target.options().max_running_requests * params_.topk,
                                                        params_.num_steps);
  step_backend_->check_layer(layer, DType::f32, DType::f32);
}

void CpuDraftHead::top_k(const float* logits, std::vector<int32_t>& tokens, std::vector<float>& probs) const {
  const int vocab = head_->draft_vocab_size();
  const float top = *std::max_element(logits, logits + vocab);
  std::vector<float> p(static_cast<size_t>(vocab));
  double sum = 0;
  for (int i = 0; i < vocab; ++i) sum += p[static_cast<size_t>(i)] = std::exp(logits[i] - top);
  for (float& x : p) x = static_cast<float>(x / sum);
  const std::vector<int32_t> best = top_k_indices(p, params_.topk);
  tokens.clear();
  probs.clear();
  for (int32_t id : best) {
    tokens.push_back(head_->to_target_id(id));
    probs.push_back(p[static_cast<size_t>(id)]);
  }
}

void CpuDraftHead::extend(std::span<DraftExtendItem* const> items) {
  DraftExtendBatch e = make_draft_extend_batch(items, target_.req_pool(), head_->feature_size());
  if (e.items.empty()) return;
  e.batch.token_to_kv_pool = draft_kv_.get();
  extend_backend_->init_forward_metadata(e.batch);
  std::vector<float> hidden;
  head_->forward(e.batch, *extend_backend_, e.features.data(), /*from_target=*/true, hidden, e.last_rows, logits_);
  const auto h = static_cast<size_t>(head_->hidden_size());
  const auto vocab = static_cast<size_t>(head_->draft_vocab_size());
  for (size_t i = 0; i < e.items.size(); ++i) {
    DraftState& s = *e.items[i]->state;
    const auto row = static_cast<size_t>(e.last_rows[i]);
    s.root_hidden.assign(hidden.begin() + static_cast<int64_t>(row * h), hidden.begin() + static_cast<int64_t>((row + 1) * h));
    top_k(logits_.data() + i * vocab, s.root_tokens, s.root_probs);
  }
}

void CpuDraftHead::draft(std::span<const DraftRequest> requests, int num_steps,
                         std::vector<DraftCandidates>& candidates) {
  SPECULA_ASSERT(num_steps >= 1 && num_steps <= params_.num_steps, "{} draft steps for a head of {}", num_steps,
                 params_.num_steps);
  const int K = params_.topk;
  const size_t B = requests.size();
  const auto h = static_cast<size_t>(head_->hidden_size());
  candidates.assign(B, {});
  std::vector<std::vector<int32_t>> frontier(B);
  std::vector<std::vector<int32_t>> slot_of(B);  // KV slot of each expanded candidate, -1 otherwise
  std::vector<float> frontier_hidden(B * static_cast<size_t>(K) * h);
  for (size_t b = 0; b < B; ++b) {
    const DraftState& s = *requests[b].state;
    SPECULA_ASSERT(s.valid() && static_cast<int>(s.root_tokens.size()) == K);
    for (int j = 0; j < K; ++j) {
      candidates[b].tokens.push_back(s.root_tokens[static_cast<size_t>(j)]);
      candidates[b].parents.push_back(-1);
      candidates[b].scores.push_back(s.root_probs[static_cast<size_t>(j)]);
      candidates[b].depths.push_back(1);
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
  for (int step = 1; step < num_steps; ++step) {
    ForwardBatch b;
    b.forward_mode = ForwardMode::DECODE;
    b.batch_size = static_cast<int>(B) * K;
    auto info = std::make_shared<DraftStepInfo>();
    for (size_t r = 0; r < B; ++r) {
      const DraftRequest& it = requests[r];
      const int32_t* row = target_.req_pool().row(it.req_pool_idx);
      slot_of[r].resize(candidates[r].tokens.size(), -1);
      for (int j = 0; j < K; ++j) {
        const int32_t f = frontier[r][static_cast<size_t>(j)];
        const int32_t own = row[it.kv_len + (step - 1) * K + j];
        slot_of[r][static_cast<size_t>(f)] = own;
        b.input_ids.push_back(candidates[r].tokens[static_cast<size_t>(f)]);
        b.positions.push_back(it.kv_len - 1 + candidates[r].depths[static_cast<size_t>(f)]);
        b.out_cache_loc.push_back(own);
        b.req_pool_indices.push_back(it.req_pool_idx);
        b.seq_lens.push_back(it.kv_len);
        // The branch: ancestors below the root, root side first, then the node.
        std::vector<int32_t> branch;
        for (int32_t a = candidates[r].parents[static_cast<size_t>(f)]; a >= 0; a = candidates[r].parents[static_cast<size_t>(a)]) {
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
      DraftCandidates& c = candidates[r];
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

}  // namespace specula
