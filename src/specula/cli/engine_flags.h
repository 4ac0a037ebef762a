// The flags `specula generate` and `specula bench serve` share: model folder, device, KV cache
// and scheduler settings, turned into EngineOptions.
#pragma once

#include <CLI/CLI.hpp>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "specula/runtime/engine.h"

namespace specula {

struct EngineFlags {
  std::string model;
  std::string device = "cpu";
  std::string attention_backend;
  int page_size = 16;
  int max_context_len = 0;
  std::string kv_cache_dtype = "auto";
  int64_t kv_cache_tokens = 0;
  int max_running_requests = 64;
  int max_queued_requests = 4096;
  int chunked_prefill_size = 4096;
  bool disable_radix_cache = false;
  bool disable_mixed_chunk = false;
  double schedule_conservativeness = 1.0;
  bool disable_cuda_graph = false;
  bool deterministic = false;
  int tp_size = 1;
  int cuda_graph_max_bs = 64;
  std::vector<int> cuda_graph_bs;
  std::string mla_extend_form = "auto";
  std::string fp8_expert_weights = "bf16";
  bool enable_double_sparsity = false;
  std::string ds_channel_config_path;
  int ds_heavy_channel_num = 32;
  int ds_heavy_token_num = 256;
  int ds_sparse_decode_threshold = 4096;
  std::string ds_heavy_channel_type = "qk";
  // Speculative decoding (SGLang's flag names); unset means the default.
  std::string speculative_algorithm;  // empty: off; EAGLE or EAGLE3
  std::string draft_model;
  std::optional<int> speculative_num_steps;
  std::optional<int> speculative_eagle_topk;
  std::optional<int> speculative_num_draft_tokens;
  std::string speculative_policy = "auto";
  std::optional<int> speculative_admission_group;
};

void add_engine_flags(CLI::App& cmd, EngineFlags& flags);
EngineOptions engine_options(const EngineFlags& flags);
// --model, or the shipped models/specula-byte-6m (next to the working directory, next to the
// binary, or in the source tree the binary was built from).
std::filesystem::path model_folder(const EngineFlags& flags);
// A folder shipped under models/ (found as model_folder finds the default model).
std::filesystem::path shipped_model(const std::string& name);

}  // namespace specula
