// DraftHead's defaults for heads without the device chain path, the head factory and the
// DRAFT_EXTEND batch both heads build.
#include "specula/speculative/draft_head.h"

#include "specula/core/error.h"
#include "specula/kv/req_to_token_pool.h"
#include "specula/model/synthetic.h"
#include "specula/runner/model_runner.h"
#include "specula/speculative/cpu_draft_head.h"
#ifdef SPECULA_HAS_CUDA
#include "specula/speculative/cuda_draft_head.h"
#endif

namespace specula {

void DraftHead::launch_draft(std::span<const DraftRequest>, int) {
  SPECULA_CHECK(false, "this draft head keeps no chains on the device");
}

void DraftHead::read_candidates(std::vector<DraftCandidates>&) const {
  SPECULA_CHECK(false, "this draft head keeps no chains on the device");
}

void DraftHead::launch_chain_extend(const VerifyDeviceResults&) {
  SPECULA_CHECK(false, "this draft head stages no chain extends");
}

std::unique_ptr<DraftHead> make_draft_head(ModelRunner& target, const EagleOptions& options) {
  if (target.options().device.is_cuda()) {
#ifdef SPECULA_HAS_CUDA
    return std::make_unique<CudaDraftHead>(target, options);
#else
    SPECULA_CHECK(false, "--device {}: this build has no CUDA support", target.options().device.str());
#endif
  }
  return std::make_unique<CpuDraftHead>(target, options);
}

DraftHeadParts load_draft_head(ModelRunner& target, const EagleOptions& options, DType kv_dtype) {
  options.params.validate();
  DraftHeadParts parts;
  if (options.synthetic_head) {
    SPECULA_CHECK(options.kind == EagleKind::EAGLE3, "synthetic draft heads are EAGLE-3 heads, not {}",
                  eagle_kind_name(options.kind));
    const Eagle3HeadConfig config = synthetic_eagle3_head_config(target.config());
    const SyntheticEagle3Weights weights(config, 11);
    parts.head = std::make_unique<EagleHead>(config, weights, target.llama_model());
  } else {
    parts.head = std::make_unique<EagleHead>(options.draft_model, options.kind, target.llama_model());
  }
  const AttentionLayer& layer = parts.head->attention_layer();
  const Device device = target.options().device;
  parts.draft_kv = std::make_unique<MHAKVPool>(KVPoolConfig{target.allocator().total_slots(), 1, layer.num_kv_heads,
                                                            layer.head_dim, layer.head_dim, kv_dtype, device});
  AttentionBackendOptions& bo = parts.backend_options;
  bo.device = device;
  bo.page_size = target.page_size();
  bo.max_context_len = target.kv_capacity();
  bo.cuda_stream = target.cuda_stream();
  return parts;
}

DraftExtendBatch make_draft_extend_batch(std::span<DraftExtendItem* const> items, ReqToTokenPool& req_pool,
                                         int feature_size) {
  DraftExtendBatch out;
  ForwardBatch& b = out.batch;
  b.forward_mode = ForwardMode::DRAFT_EXTEND;
  const auto width = static_cast<size_t>(feature_size);
  for (DraftExtendItem* it : items) {
    const auto len = static_cast<int>(it->next_tokens.size());
    if (len == 0) continue;
    SPECULA_CHECK(it->features != nullptr, "draft extend of request {}: no target features", it->req_pool_idx);
    const int32_t* row = req_pool.row(it->req_pool_idx);
    for (int i = 0; i < len; ++i) {
      b.input_ids.push_back(it->next_tokens[static_cast<size_t>(i)]);
      b.positions.push_back(it->start + i);
      b.out_cache_loc.push_back(row[it->start + i]);
    }
    out.features.insert(out.features.end(), it->features, it->features + static_cast<size_t>(len) * width);
    b.req_pool_indices.push_back(it->req_pool_idx);
    b.seq_lens.push_back(it->start + len);
    b.extend_prefix_lens.push_back(it->start);
    b.extend_seq_lens.push_back(len);
    out.last_rows.push_back(static_cast<int64_t>(b.input_ids.size()) - 1);
    out.items.push_back(it);
  }
  b.batch_size = static_cast<int>(out.items.size());
  b.req_to_token_pool = &req_pool;
  return out;
}

}  // namespace specula
