// Tensor parallelism's layout and the shard weight view.
#include "specula/model/tp_shard.h"

#include <cstring>

#include "specula/core/error.h"

namespace specula {

namespace {

// Part `rank` of `total` split evenly `size` ways (total divisible by size).
TpRange even(int64_t total, TpShard s) { return {total * s.rank / s.size, total * (s.rank + 1) / s.size}; }

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

void check_tensor_parallel(const ModelConfig& c, int tp_size) {
  SPECULA_CHECK(tp_size >= 1, "--tp-size {} is not valid; it must be >= 1", tp_size);
  if (tp_size == 1) return;
  SPECULA_CHECK(!c.has_moe() || c.moe.moe_intermediate_size % tp_size == 0,
                "--tp-size {}: the experts' moe_intermediate_size {} does not split evenly; use a tp size that divides it",
                tp_size, c.moe.moe_intermediate_size);
  SPECULA_CHECK(!c.dual_chunk.enabled(), "--tp-size {}: dual chunk attention is not supported with tensor parallelism; use --tp-size 1", tp_size);
  SPECULA_CHECK(c.num_attention_heads % tp_size == 0,
                "--tp-size {}: the model's {} attention heads do not split evenly; use a tp size that divides {}",
                tp_size, c.num_attention_heads, c.num_attention_heads);
  const int kv = c.num_key_value_heads;
  SPECULA_CHECK(kv % tp_size == 0 || tp_size % kv == 0,
                "--tp-size {}: the model's {} KV heads can be neither split nor replicated evenly; use a tp size that "
                "divides {} or a multiple of it", tp_size, kv, kv);
  SPECULA_CHECK(c.intermediate_size % tp_size == 0,
                "--tp-size {}: the model's intermediate_size {} does not split evenly; use a tp size that divides it",
                tp_size, c.intermediate_size);
  const TpLayout last = tp_layout(c, {tp_size - 1, tp_size});
  SPECULA_CHECK(last.vocab.size() > 0, "--tp-size {}: the vocabulary of {} ids is too small to split that many ways",
                tp_size, c.vocab_size);
}

TpLayout tp_layout(const ModelConfig& c, TpShard s) {
  SPECULA_CHECK(s.size >= 1 && s.rank >= 0 && s.rank < s.size, "tensor-parallel rank {} of {} is not valid", s.rank,
                s.size);
  TpLayout l;
  l.q_heads = even(c.num_attention_heads, s);
  l.intermediate = even(c.intermediate_size, s);
  if (c.has_moe()) l.moe_intermediate = even(c.moe.moe_intermediate_size, s);
  const int kv = c.num_key_value_heads;
  if (kv >= s.size) {
    l.kv_heads = even(kv, s);
  } else {
    // Each KV head serves tp_size / kv consecutive ranks, whose q heads all read it.
    const int64_t head = static_cast<int64_t>(s.rank) * kv / s.size;
    l.kv_heads = {head, head + 1};
    l.kv_replicated = true;
  }
  const int64_t per = (static_cast<int64_t>(c.vocab_size) + s.size * 32 - 1) / (s.size * 32) * 32;
  l.vocab.begin = std::min<int64_t>(per * s.rank, c.vocab_size);
  l.vocab.end = std::min<int64_t>(l.vocab.begin + per, c.vocab_size);
  return l;
}

ModelConfig tp_shard_config(const ModelConfig& c, TpShard s) {
  if (s.size == 1) return c;
  check_tensor_parallel(c, s.size);
  const TpLayout l = tp_layout(c, s);
  ModelConfig out = c;
  out.num_attention_heads = static_cast<int>(l.q_heads.size());
  out.num_key_value_heads = static_cast<int>(l.kv_heads.size());
  out.intermediate_size = static_cast<int>(l.intermediate.size());
  if (c.has_moe()) out.moe.moe_intermediate_size = static_cast<int>(l.moe_intermediate.size());
  return out;
}

TpShardWeights::TpShardWeights(const WeightSource& source, const ModelConfig& config, TpShard shard,
                               std::shared_ptr<std::mutex> lock)
    : source_(source), config_(config), shard_(shard), layout_(tp_layout(config, shard)), lock_(std::move(lock)) {
  if (shard.size > 1) check_tensor_parallel(config, shard.size);
}

TensorView TpShardWeights::get(const std::string& name, const Shape& shape) const {
  const ModelConfig& c = config_;
  const int64_t D = c.head_dim;
  enum class Cut { whole, rows, cols, first_rank_only } cut = Cut::whole;
  TpRange range;
  int64_t full = 0;  // the split dimension's full size
  const bool weight = ends_with(name, ".weight");
  auto is = [&](const char* part) {
    return ends_with(name, std::string(part) + ".weight") || ends_with(name, std::string(part) + ".bias");
  };
  const bool expert = name.find(".experts.") != std::string::npos;
  const bool shared_expert = name.find(".shared_experts.") != std::string::npos;
  // Rows [begin, end) of heads in q_heads, `per` rows (or columns) each.
  auto heads = [&](int64_t per) { return TpRange{layout_.q_heads.begin * per, layout_.q_heads.end * per}; };
  if (shard_.size > 1 && expert) {
    // Routed experts (transformers' gate/up/down_proj, Mixtral's w1/w3/w2).
    if (is("gate_proj") || is("up_proj") || is("w1") || is("w3")) {
      cut = Cut::rows, range = layout_.moe_intermediate, full = c.moe.moe_intermediate_size;
    } else if (is("down_proj") || is("w2")) {
      cut = Cut::cols, range = layout_.moe_intermediate, full = c.moe.moe_intermediate_size;
    }
  } else if (shard_.size > 1 && shared_expert) {
    // DeepSeek's always-on experts: one MLP n_shared_experts x moe_intermediate_size wide, split
    // like a dense one (any split of the intermediate units sums to the same output).
    full = static_cast<int64_t>(c.moe.n_shared_experts) * c.moe.moe_intermediate_size;
    range = even(full, shard_);
    if (is("gate_proj") || is("up_proj")) {
      cut = Cut::rows;
    } else if (is("down_proj")) {
      cut = Cut::cols;
    }
  } else if (shard_.size > 1 && c.is_mla()) {
    // Multi-head latent attention: the latent down-projections (q_a_proj, kv_a_proj_with_mqa)
    // and their norms are whole on every rank, as is the latent KV cache; the per-head
    // up-projections are split by head, o_proj by the heads' value columns.
    const MlaConfig& m = c.mla;
    const int64_t H = c.num_attention_heads, qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
    const int64_t kv_b = m.qk_nope_head_dim + m.v_head_dim;
    if (is("self_attn.q_proj") || is("self_attn.q_b_proj")) {
      cut = Cut::rows, range = heads(qk), full = H * qk;
    } else if (is("self_attn.kv_b_proj")) {
      cut = Cut::rows, range = heads(kv_b), full = H * kv_b;
    } else if (is("self_attn.o_proj")) {
      cut = weight ? Cut::cols : Cut::first_rank_only, range = heads(m.v_head_dim), full = H * m.v_head_dim;
    }
  } else if (shard_.size > 1) {
    if (is("self_attn.q_proj")) {
      cut = Cut::rows, range = heads(D), full = c.num_attention_heads * D;
    } else if (is("self_attn.k_proj") || is("self_attn.v_proj")) {
      cut = Cut::rows, range = {layout_.kv_heads.begin * D, layout_.kv_heads.end * D}, full = c.num_key_value_heads * D;
    } else if (is("self_attn.o_proj")) {
      cut = weight ? Cut::cols : Cut::first_rank_only, range = heads(D), full = c.num_attention_heads * D;
    }
  }
  if (shard_.size > 1 && !expert && !shared_expert) {
    if (is("mlp.gate_proj") || is("mlp.up_proj")) {
      cut = Cut::rows, range = layout_.intermediate, full = c.intermediate_size;
    } else if (is("mlp.down_proj")) {
      cut = weight ? Cut::cols : Cut::first_rank_only, range = layout_.intermediate, full = c.intermediate_size;
    }
  }
  std::lock_guard<std::mutex> hold(*lock_);
  if (cut == Cut::whole || cut == Cut::first_rank_only) {
    const TensorView t = source_.get(name, shape);
    scratch_ = Buffer(t.dtype(), shape);
    if (cut == Cut::first_rank_only && shard_.rank != 0) {
      std::memset(scratch_.data(), 0, scratch_.nbytes());
    } else {
      std::memcpy(scratch_.data(), t.data(), t.nbytes());
    }
    return scratch_.view();
  }
  const int dim = cut == Cut::rows ? 0 : shape.rank() - 1;
  SPECULA_CHECK(shape.rank() >= 1 && shape[dim] == range.size(),
                "{}: rank {} of {} asked for shape {}, which is not its slice of {} along the split dimension", name,
                shard_.rank, shard_.size, shape.str(), full);
  Shape full_shape = shape;
  full_shape[dim] = full;
  source_.read_slice(name, full_shape, dim, range.begin, range.end, scratch_);
  return scratch_.view();
}

}  // namespace specula
