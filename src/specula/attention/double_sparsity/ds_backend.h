// DoubleSparsityBackend (SGLang's double_sparsity_backend): decode attends to a few heavy tokens
// per request and KV head, found from a handful of key channels, instead of the whole context.
//
// It wraps a dense backend (cpu or cuda), which serves every extend-like step and every decode
// batch whose requests are all shorter than sparse_decode_threshold. Beside the KV pool it keeps
// a label cache: label[slot, h, c] = K[slot, h, channels[layer][h][c]], as the pool stores K
// (written after each step's K/V, from the pool itself). A sparse decode, per request r and KV
// head h of query heads G(h):
//   1. q_label[c] = sum over g in G(h) of q[g][channels[h][c]]
//   2. score[j] = sum over c of q_label[c] * label[slot(r, j), h, c], for every key j
//   3. the heavy_token_num keys with the highest scores (ties: the lower position), or every key
//      when the request is shorter than sparse_decode_threshold or has at most heavy_token_num
//   4. each query head of G(h) attends (scale, soft-cap, sinks) over those keys only.
// One selection per KV head (the group's scores summed) rather than per query head: with GQA the
// group's heads then read the same keys, and with MHA the two are the same thing.
#pragma once

#include <memory>
#include <vector>

#include "specula/attention/backend.h"
#include "specula/attention/double_sparsity/ds_config.h"
#include "specula/attention/metadata.h"

namespace specula {

class ThreadPool;

class DoubleSparsityBackend final : public AttentionBackend {
 public:
  DoubleSparsityBackend(std::unique_ptr<AttentionBackend> dense, std::shared_ptr<const DoubleSparsityConfig> config,
                        const AttentionBackendOptions& options);
  ~DoubleSparsityBackend() override;

  std::string_view name() const override { return "double_sparsity"; }
  void check_layer(const AttentionLayer& layer, DType q_dtype, DType kv_dtype) const override;
  void init_forward_metadata(const ForwardBatch& batch) override;
  void forward_extend(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                      const AttentionLayer& layer, const ForwardBatch& batch, const ForwardOptions& options) override;
  void forward_decode(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                      const AttentionLayer& layer, const ForwardBatch& batch, const ForwardOptions& options) override;

  // Whether this step's decode is sparse (some request at or above the threshold).
  bool sparse_step() const { return sparse_; }
  // Labels for slots whose K reached the pool some other way (a benchmark's random cache).
  void label_slots(const AttentionLayer& layer, MHAKVPool& pool, const std::vector<int32_t>& slots);

 private:
  struct DeviceState;

  // Copies the labels of the slots just written (batch.out_cache_loc) out of the pool's K.
  void write_labels(const AttentionLayer& layer, const ForwardBatch& batch);
  void sparse_decode_cpu(const TensorView& q, const TensorView& out, const AttentionLayer& layer,
                         const ForwardBatch& batch, const ForwardOptions& options);
  void sparse_decode_cuda(const TensorView& q, const TensorView& out, const AttentionLayer& layer,
                          const ForwardBatch& batch, const ForwardOptions& options);
  TensorView label_buffer(const AttentionLayer& layer, const MHAKVPool& pool);

  std::unique_ptr<AttentionBackend> dense_;
  std::shared_ptr<const DoubleSparsityConfig> config_;
  AttentionBackendOptions options_;
  ThreadPool* threads_;
  std::vector<Buffer> labels_;  // per layer: [slots, kv_heads, C] on the host, [kv_heads, slots, C] on the GPU
  const MHAKVPool* labels_pool_ = nullptr;
  PageTable page_table_;
  std::vector<int32_t> kv_lens_;
  bool sparse_ = false;
  std::unique_ptr<DeviceState> device_;
};

}  // namespace specula
