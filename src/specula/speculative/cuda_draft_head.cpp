// CudaDraftHead: DraftHead over EagleCudaHead.
#include "specula/speculative/cuda_draft_head.h"

#include "specula/core/error.h"
#include "specula/runner/model_runner.h"

namespace specula {

CudaDraftHead::CudaDraftHead(ModelRunner& target, const EagleOptions& options)
    : target_(target), params_(options.params) {
  DraftHeadParts parts = load_draft_head(target, options, DType::bf16);
  head_ = std::move(parts.head);
  draft_kv_ = std::move(parts.draft_kv);
  const AttentionLayer& layer = head_->attention_layer();
  // The head's graphs are recorded on the target's stream, which the backend launches on too.
  extend_backend_ = make_attention_backend("cuda", parts.backend_options);
  extend_backend_->check_layer(layer, DType::bf16, DType::bf16);
  EagleCudaHeadOptions ho;
  ho.page_size = target.page_size();
  ho.max_context_len = target.kv_capacity();
  ho.max_batch = target.options().max_running_requests;
  ho.num_req_rows = target.req_pool().size();
  ho.graph_batch_sizes = target.cuda_graph_batch_sizes();
  ho.padding_slot = target.cuda_graph_padding_slot();
  ho.shapes = policy_shapes(params_, options.policy);
  cuda_head_ = std::make_unique<EagleCudaHead>(*head_, params_, *draft_kv_, *extend_backend_, target.cuda_stream(), ho);
}

CudaDraftHead::~CudaDraftHead() = default;

void CudaDraftHead::extend(std::span<DraftExtendItem* const> items) {
  // After a cycle (at most num_draft_tokens pairs per request): the captured graph, launched and
  // not waited for; the roots stay in the head's root store.
  std::vector<DraftExtendInput> inputs;
  std::vector<DraftExtendItem*> used;
  for (DraftExtendItem* it : items) {
    if (it->next_tokens.empty()) continue;
    SPECULA_CHECK(it->features != nullptr, "draft extend of request {}: no target features", it->req_pool_idx);
    inputs.push_back({it->start, static_cast<int>(it->next_tokens.size()), it->req_pool_idx,
                      target_.req_pool().row(it->req_pool_idx), it->next_tokens.data(), it->features});
    used.push_back(it);
  }
  if (used.empty()) return;
  if (!cuda_head_->extend_after_cycle(inputs)) {
    DraftExtendBatch e = make_draft_extend_batch(used, target_.req_pool(), head_->feature_size());
    e.batch.token_to_kv_pool = draft_kv_.get();
    extend_backend_->init_forward_metadata(e.batch);
    const std::vector<int32_t> rows(e.last_rows.begin(), e.last_rows.end());
    cuda_head_->extend(e.batch, e.features.data(), rows, e.batch.req_pool_indices);
  }
  for (DraftExtendItem* it : used) it->state->on_device = true;
}

std::vector<DraftLoopInput> CudaDraftHead::loop_inputs(std::span<const DraftRequest> requests) const {
  std::vector<DraftLoopInput> inputs;
  for (const DraftRequest& r : requests) {
    SPECULA_ASSERT(r.state->on_device);
    inputs.push_back({r.kv_len, target_.req_pool().row(r.req_pool_idx), r.req_pool_idx});
  }
  return inputs;
}

void CudaDraftHead::draft(std::span<const DraftRequest> requests, int num_steps,
                          std::vector<DraftCandidates>& candidates) {
  cuda_head_->draft_loop(loop_inputs(requests), num_steps, candidates);
}

DraftState CudaDraftHead::root_on_host(int32_t req_pool_idx, const DraftState& state) const {
  if (!state.on_device) return state;
  DraftState out;
  cuda_head_->read_root(req_pool_idx, out.root_hidden, out.root_tokens, out.root_probs);
  return out;
}

void CudaDraftHead::launch_draft(std::span<const DraftRequest> requests, int num_steps) {
  cuda_head_->launch_draft_loop(loop_inputs(requests), num_steps);
}

void CudaDraftHead::read_candidates(std::vector<DraftCandidates>& candidates) const {
  cuda_head_->read_draft_candidates(candidates);
}

bool CudaDraftHead::stage_chain_extend(std::span<const DraftRequest> requests, int num_draft_tokens) {
  return cuda_head_->stage_chain_extend(loop_inputs(requests), num_draft_tokens);
}

void CudaDraftHead::launch_chain_extend(const VerifyDeviceResults& results) { cuda_head_->launch_chain_extend(results); }

}  // namespace specula
