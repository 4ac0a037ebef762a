// DraftCascadeBackend implementation.
#include "specula/speculative/draft_backend.h"

#include "specula/attention/merge_state.h"
#include "specula/core/error.h"

namespace specula {

DraftCascadeBackend::DraftCascadeBackend(std::string_view backend, const AttentionBackendOptions& options, int max_rows,
                                         int max_branch_len)
    : options_(options), branch_rows_(max_rows, max_branch_len) {
  prefix_ = make_attention_backend(backend, options);
  AttentionBackendOptions single = options;
  single.page_size = 1;
  single.max_context_len = max_branch_len;
  branch_ = make_attention_backend(backend, single);
  // Every row of the branch table belongs to this backend for good.
  SPECULA_ASSERT(branch_rows_.alloc(max_rows).has_value());
}

void DraftCascadeBackend::check_layer(const AttentionLayer& layer, DType q_dtype, DType kv_dtype) const {
  prefix_->check_layer(layer, q_dtype, kv_dtype);
  branch_->check_layer(layer, q_dtype, kv_dtype);
}

void DraftCascadeBackend::init_forward_metadata(const ForwardBatch& batch) {
  SPECULA_CHECK(batch.forward_mode == ForwardMode::DECODE, "the draft cascade backend serves DECODE steps, not {}",
                forward_mode_name(batch.forward_mode));
  const auto* info = dynamic_cast<const DraftStepInfo*>(batch.spec_info.get());
  SPECULA_CHECK(info != nullptr, "a draft step needs DraftStepInfo as its spec_info");
  const auto rows = static_cast<size_t>(batch.batch_size);
  SPECULA_CHECK(info->prefix_req_pool_indices.size() == rows && info->prefix_lens.size() == rows &&
                    info->branch_lens.size() == rows,
                "draft step of {} rows has {} prefix rows, {} prefix lengths and {} branch lengths", rows,
                info->prefix_req_pool_indices.size(), info->prefix_lens.size(), info->branch_lens.size());
  SPECULA_CHECK(static_cast<int>(rows) <= branch_rows_.size(), "draft step of {} rows exceeds the {} this backend holds",
                rows, branch_rows_.size());

  prefix_batch_ = ForwardBatch{};
  prefix_batch_.forward_mode = ForwardMode::DECODE;
  prefix_batch_.batch_size = batch.batch_size;
  prefix_batch_.input_ids = batch.input_ids;
  prefix_batch_.positions = batch.positions;
  prefix_batch_.req_pool_indices = info->prefix_req_pool_indices;
  prefix_batch_.seq_lens = info->prefix_lens;
  prefix_batch_.out_cache_loc = batch.out_cache_loc;  // not written: the prefix pass only reads
  prefix_batch_.req_to_token_pool = batch.req_to_token_pool;
  prefix_batch_.token_to_kv_pool = batch.token_to_kv_pool;

  branch_batch_ = prefix_batch_;
  branch_batch_.req_to_token_pool = &branch_rows_;
  branch_batch_.seq_lens = info->branch_lens;
  branch_batch_.req_pool_indices.resize(rows);
  size_t offset = 0;
  for (size_t r = 0; r < rows; ++r) {
    const int32_t len = info->branch_lens[r];
    SPECULA_CHECK(len >= 1 && offset + static_cast<size_t>(len) <= info->branch_slots.size(),
                  "draft row {}: branch length {} does not fit the {} branch slots", r, len, info->branch_slots.size());
    SPECULA_CHECK(info->branch_slots[offset + static_cast<size_t>(len) - 1] == batch.out_cache_loc[r],
                  "draft row {}: the branch must end with the row's own slot {}", r, batch.out_cache_loc[r]);
    branch_batch_.req_pool_indices[r] = static_cast<int32_t>(r);
    branch_rows_.write(static_cast<int32_t>(r), 0,
                       std::span<const int32_t>(info->branch_slots).subspan(offset, static_cast<size_t>(len)));
    offset += static_cast<size_t>(len);
  }
  SPECULA_CHECK(offset == info->branch_slots.size(), "draft step has {} branch slots; the branch lengths sum to {}",
                info->branch_slots.size(), offset);
  prefix_->init_forward_metadata(prefix_batch_);
  branch_->init_forward_metadata(branch_batch_);
}

void DraftCascadeBackend::forward_extend(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                                         const AttentionLayer&, const ForwardBatch& batch, const ForwardOptions&) {
  SPECULA_CHECK(false, "the draft cascade backend serves DECODE steps, not {}", forward_mode_name(batch.forward_mode));
}

void DraftCascadeBackend::forward_decode(const TensorView& q, const TensorView& k, const TensorView& v,
                                         const TensorView& out, const AttentionLayer& layer, const ForwardBatch&,
                                         const ForwardOptions& options) {
  const int64_t rows = q.shape()[0];
  const Device device = out.device();
  // Scratch for the branch pass and both LSEs, grown once and reused by every layer and step.
  const int64_t out_elems = out.numel(), lse_elems = rows * layer.num_q_heads;
  auto grow = [&](Buffer& b, DType dtype, int64_t elements) {
    if (b.data() == nullptr || b.dtype() != dtype || b.numel() < elements) b = Buffer(dtype, {elements}, device);
  };
  grow(branch_out_, out.dtype(), out_elems);
  grow(lse_scratch_, DType::f32, 3 * lse_elems);
  const TensorView branch_out(branch_out_.data(), out.dtype(), out.shape(), device);
  const Shape lse_shape{rows, layer.num_q_heads};
  const TensorView prefix_lse(lse_scratch_.data_as<float>(), DType::f32, lse_shape, device);
  const TensorView branch_lse(lse_scratch_.data_as<float>() + lse_elems, DType::f32, lse_shape, device);
  ForwardOptions branch_options;
  branch_options.save_kv_cache = options.save_kv_cache;
  branch_options.lse = branch_lse;
  branch_->forward(q, k, v, branch_out, layer, branch_batch_, branch_options);
  ForwardOptions prefix_options;
  prefix_options.save_kv_cache = false;
  prefix_options.lse = prefix_lse;
  prefix_->forward(q, k, v, out, layer, prefix_batch_, prefix_options);
  const TensorView lse = options.lse.defined()
                             ? options.lse
                             : TensorView(lse_scratch_.data_as<float>() + 2 * lse_elems, DType::f32, lse_shape, device);
  merge_state(out, prefix_lse, branch_out, branch_lse, out, lse, options_.cuda_stream);
}

}  // namespace specula
