// A test fixture for MLA backends: a paged latent cache (shuffled pages) with a random cached
// prefix per request, a ForwardBatch of the chosen mode, random queries and new latent rows,
// optional EAGLE-style tree masks and sparse top-k indices, and the float64 naive reference over
// the rows the pool holds after the step (dequantised by the pool, whose codec has its own tests).
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "specula/attention/mla/mla_backend.h"
#include "specula/kv/mla_kv_pool.h"
#include "specula/kv/req_to_token_pool.h"

namespace specula::testing {

struct MlaCase {
  ForwardMode mode = ForwardMode::DECODE;
  std::vector<int> prefix_lens;  // cached tokens per request (DECODE: seq_len - 1)
  std::vector<int> extend_lens;  // new tokens per request (DECODE: 1; TARGET_VERIFY: all equal)
  int num_q_heads = 16;
  int kv_lora_rank = 512;
  int qk_rope_head_dim = 64;
  int page_size = 1;
  MlaKVFormat format = MlaKVFormat::bf16;
  DType q_dtype = DType::f32;  // q and output
  bool sinks = false;
  bool tree_mask = false;   // TARGET_VERIFY: random trees (prefix visible)
  int topk = 0;             // > 0: sparse with this many indices per token
  int prefix_chunk_tokens = 0;
  MlaExtendForm extend_form = MlaExtendForm::automatic;
  int64_t expanded_chunk_rows = 0;
};

// The expanded form's inputs at qk_nope_head_dim = v_head_dim = 128: per-head kv_b_proj halves
// w_uk, w_uv [H, 128, kv_lora_rank] and queries q_nope [n, H, 128] (bf16 values).
struct ExpandedInputs {
  std::vector<float> w_uk, w_uv, q_nope;
};

// A named case for parameterised tests, and random lengths in [lo, hi].
struct NamedMlaCase {
  std::string name;
  MlaCase c;
};
std::vector<int> random_lens(std::mt19937_64& rng, int n, int lo, int hi);

struct MlaResult {
  std::vector<double> out;  // [num_tokens, num_q_heads, kv_lora_rank]
  std::vector<double> lse;  // [num_tokens, num_q_heads]
  // reference() only: sum of p |v| over sum of p per output element (sinks included in the sum of
  // p), the scale of the error that rounding the probabilities to bf16 makes.
  std::vector<double> magnitude;
};

class MlaFixture {
 public:
  MlaFixture(const MlaCase& c, Device device, uint64_t seed);

  const MlaLayer& layer() const { return layer_; }
  MlaBackendOptions backend_options() const;
  int64_t num_tokens() const { return static_cast<int64_t>(token_req_.size()); }

  // Runs the backend (metadata, the write of the new rows, attention) on the fixture's device.
  MlaResult run(MlaAttentionBackend& backend);
  // CUDA only: captures the step into a CUDA graph on backend_options().cuda_stream (graph
  // metadata hooks), replays it, and returns the replay's result.
  MlaResult run_graph(MlaAttentionBackend& backend, void* stream);
  // The float64 reference over the pool's rows; call after run (the new rows are in the pool).
  // bf16_operands: over the rows rounded once to bf16, as a GPU's MMA operands hold them.
  MlaResult reference(bool bf16_operands = false) const;

  // The expanded form (CUDA): random weights and q_nope; the fixture's queries become the absorbed
  // ones, [q_nope W_UK ; q_pe], so reference() is the latent-space result that W_UV maps to the
  // expanded one (reference_expanded).
  ExpandedInputs make_expanded();
  // forward_expanded with keys and values expanded on the host (an implementation independent of
  // the model's): out [n, H, 128], lse.
  MlaResult run_expanded(MlaAttentionBackend& backend, const ExpandedInputs& e);
  MlaResult reference_expanded(const ExpandedInputs& e) const;

  // The key positions token t sees (dense rules, or its valid sparse indices).
  std::vector<int32_t> visible(int64_t t) const;

 private:
  // The step's inputs and outputs on the fixture's device.
  struct StepTensors {
    Buffer q, kv_c, k_pe, out, lse, topk;
    MlaForwardOptions options;
  };
  StepTensors step_tensors() const;

  MlaCase case_;
  Device device_;
  MlaLayer layer_;
  std::mt19937_64 rng_;
  std::unique_ptr<ReqToTokenPool> req_pool_;
  std::unique_ptr<MLAKVPool> pool_;
  std::shared_ptr<SpecInfo> spec_;
  ForwardBatch batch_;
  std::vector<int32_t> kv_lens_;
  std::vector<int32_t> token_req_;  // [num_tokens]
  std::vector<int32_t> token_pos_;  // [num_tokens]
  std::vector<float> q_;            // [num_tokens, num_q_heads, qk_head_dim], rounded to q_dtype
  std::vector<float> kv_c_;         // [num_tokens, kv_lora_rank]
  std::vector<float> k_pe_;         // [num_tokens, qk_rope_head_dim]
  std::vector<std::vector<uint8_t>> masks_;  // per request [extend, kv_len]
  std::vector<int32_t> topk_indices_;        // [num_tokens, topk]
};

}  // namespace specula::testing
