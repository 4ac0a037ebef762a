// ForwardMode and ForwardBatch (SGLang's model_executor/forward_batch_info): what one model step
// computes. The scheduler fills a ForwardBatch; the attention backend reads it once per step in
// init_forward_metadata and every layer then attends with that metadata.
//
// Length conventions (as in SGLang):
//  EXTEND / MIXED / DRAFT_EXTEND: request i adds extend_seq_lens[i] tokens after a cached prefix
//    of extend_prefix_lens[i]; seq_lens[i] = prefix + extend. MIXED is an extend batch in which
//    decoding requests extend by one token.
//  DECODE: one new token per request; seq_lens[i] counts it.
//  TARGET_VERIFY: spec_info->num_draft_tokens draft tokens per request after seq_lens[i]
//    committed ones; seq_lens do NOT count the draft tokens; spec_info->custom_mask (if any)
//    says which keys each draft token sees.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "specula/core/tensor.h"

namespace specula {

class ReqToTokenPool;
class MHAKVPool;
class MLAKVPool;

enum class ForwardMode : uint8_t { EXTEND, DECODE, MIXED, IDLE, TARGET_VERIFY, DRAFT_EXTEND };

std::string_view forward_mode_name(ForwardMode mode);
// Modes whose queries are runs of new tokens per request (attention goes through forward_extend).
inline bool is_extend_like(ForwardMode m) {
  return m == ForwardMode::EXTEND || m == ForwardMode::MIXED || m == ForwardMode::DRAFT_EXTEND ||
         m == ForwardMode::TARGET_VERIFY;
}

// A TARGET_VERIFY step's results as a GPU model holds them on the device, for on_device_results.
struct VerifyDeviceResults {
  const int32_t* input_ids = nullptr;   // [num_tokens] the tree tokens the step ran over
  const int32_t* greedy_ids = nullptr;  // [num_tokens] each row's greedy token (-1: none above -inf)
  const float* captured = nullptr;      // [num_tokens, feature width] the captured hidden states
  int64_t num_tokens = 0;
};

// Speculative-decoding input attached to a batch (EAGLE's verify/draft inputs grow from this).
struct SpecInfo {
  int num_draft_tokens = 0;
  // TARGET_VERIFY tree mask: u8 (0/1), per request a row-major [num_draft_tokens,
  // seq_len + num_draft_tokens] block, requests concatenated. Empty means causal.
  std::vector<uint8_t> custom_mask;
  // The mask's promise that every query sees its request's whole prefix [0, seq_len) (a tree
  // over a shared prefix), so only each request's [num_draft_tokens, num_draft_tokens] tree block
  // carries information. The CUDA backend then attends as decode does, per query over the prefix
  // plus the tree tokens it sees.
  bool prefix_visible = false;
  // Tree tokens still on the GPU (the draft loop's output, written on the model's stream): tree
  // tokens [1, num_draft_tokens) of request r are the int32s at device_tree_tokens + r *
  // device_tree_pitch, and input_ids holds placeholders there. A GPU model copies them into its
  // ids before running, so the verify follows the draft loop with no host round trip; CPU models
  // refuse such a batch.
  const int32_t* device_tree_tokens = nullptr;
  int64_t device_tree_pitch = 0;
  // Called by a GPU model, for a verify asked for greedy ids and captured states, once the step's
  // downloads are queued on its stream and before it waits for them: device work queued here
  // (EAGLE's draft extend for all-greedy chains) runs while the host handles the results.
  std::function<void(const VerifyDeviceResults&)> on_device_results;
  virtual ~SpecInfo() = default;
};

struct ForwardBatch {
  ForwardMode forward_mode = ForwardMode::IDLE;
  int batch_size = 0;

  std::vector<int32_t> input_ids;           // [num_tokens]
  std::vector<int32_t> positions;           // [num_tokens]
  std::vector<int32_t> req_pool_indices;    // [batch_size]
  std::vector<int32_t> seq_lens;            // [batch_size]
  std::vector<int32_t> extend_prefix_lens;  // [batch_size], extend-like modes
  std::vector<int32_t> extend_seq_lens;     // [batch_size], extend-like modes
  std::vector<int32_t> out_cache_loc;       // [num_tokens] KV slots the new tokens are written to

  ReqToTokenPool* req_to_token_pool = nullptr;
  MHAKVPool* token_to_kv_pool = nullptr;
  MLAKVPool* mla_kv_pool = nullptr;  // models with MLA attention (instead of token_to_kv_pool)
  std::shared_ptr<SpecInfo> spec_info;

  int64_t num_tokens() const { return static_cast<int64_t>(out_cache_loc.size()); }
  // Query tokens of request i in this step and the KV length it attends over (after this step).
  int32_t query_len(int i) const;
  int32_t kv_len(int i) const;
  // Checks sizes and the length invariants above; throws specula::Error naming the field.
  void validate() const;
};

// CUDA-graph padding (SGLang's CudaGraphRunner pads a batch up to a captured size): a DECODE
// batch of batch_size one-token requests of token id 0 at position 0 in request row req_row,
// whose token is KV slot slot (a page set aside for padding). Pools are left unset.
ForwardBatch padding_decode_batch(int batch_size, int32_t req_row, int32_t slot);
// `batch` (DECODE) with padding requests appended up to batch_size.
ForwardBatch pad_decode_batch(const ForwardBatch& batch, int batch_size, int32_t req_row, int32_t slot);

}  // namespace specula
