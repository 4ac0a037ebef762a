// Tensor parallelism's arithmetic (SGLang's and Megatron's layout): which part of a Llama-family
// model each of tp_size ranks holds. Attention is split by heads (q/k/v column-parallel: rows of
// [out, in]; o_proj row-parallel: columns, its partial sums all-reduced), the MLP by intermediate
// columns (gate/up rows, down columns), the lm_head by vocabulary rows. KV heads are split when
// there are at least tp_size of them, else each is replicated over tp_size / num_kv_heads ranks.
// No GPU is needed here: this is what the CPU tests check.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "specula/model/config.h"
#include "specula/model/weights.h"

namespace specula {

struct TpRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const TpRange&) const = default;
};

struct TpShard {
  int rank = 0;
  int size = 1;
};

// What rank shard.rank holds of a model of `config`.
struct TpLayout {
  TpRange q_heads;       // of num_attention_heads
  TpRange kv_heads;      // of num_key_value_heads (one head when replicated)
  bool kv_replicated = false;
  TpRange intermediate;  // of intermediate_size
  TpRange moe_intermediate;  // of each routed expert's moe_intermediate_size (mixture-of-experts models)
  TpRange vocab;         // lm_head rows: multiples of 32 apart, so token masks split on word bounds
};

// Throws specula::Error, naming the value and what would divide, when the model cannot be split
// tp_size ways (heads, KV heads, intermediate sizes). A mixture of experts splits every expert's
// intermediate columns (SGLang's TP MoE): each rank runs every expert over its part, the router
// is whole. Multi-head latent attention (DeepSeek) splits its heads; the latent KV is whole on
// every rank (SGLang's layout: the latent row is shared by all heads).
void check_tensor_parallel(const ModelConfig& config, int tp_size);
TpLayout tp_layout(const ModelConfig& config, TpShard shard);
// The config of one rank's part: its q heads, KV heads and intermediate size; everything else
// (hidden size, vocabulary, layers) as the model's.
ModelConfig tp_shard_config(const ModelConfig& config, TpShard shard);

// A rank's view of the model's weights: asked for a tensor in its shard's shape (as a model built
// from tp_shard_config asks), it reads the full tensor from `source` and returns the rank's
// slice: rows of q/k/v and gate/up (an expert's too), columns of o_proj and down_proj (an
// expert's too); under MLA, rows of q_proj / q_b_proj / kv_b_proj and columns of o_proj by head.
// Row-parallel biases (o_proj,
// down_proj) come whole on rank 0 and as zeros elsewhere, so the all-reduce adds them once.
// Everything else (norms, embedding, lm_head) comes whole. `lock` serialises reads of a shared
// source whose views live until its next call (SyntheticWeights); ranks loading in parallel pass
// the same mutex. Views stay valid until this object's next get.
class TpShardWeights final : public WeightSource {
 public:
  TpShardWeights(const WeightSource& source, const ModelConfig& config, TpShard shard,
                 std::shared_ptr<std::mutex> lock = std::make_shared<std::mutex>());
  TensorView get(const std::string& name, const Shape& shape) const override;
  bool contains(const std::string& name) const override { return source_.contains(name); }
  size_t total_bytes() const override { return source_.total_bytes() / static_cast<size_t>(shard_.size); }

 private:
  const WeightSource& source_;
  ModelConfig config_;
  TpShard shard_;
  TpLayout layout_;
  std::shared_ptr<std::mutex> lock_;
  mutable Buffer scratch_;
};

}  // namespace specula
