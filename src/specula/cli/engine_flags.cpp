// Engine flags of the command-line tool.
#include "specula/cli/engine_flags.h"

#include <fmt/format.h>
#include <unistd.h>

#include <vector>

#include "specula/core/error.h"
#include "specula/speculative/eagle_tree.h"

namespace specula {

void add_engine_flags(CLI::App& cmd, EngineFlags& f) {
  cmd.add_option("--model", f.model, "Hugging Face model folder (default: the shipped models/specula-byte-6m)");
  cmd.add_option("--device", f.device, "cpu, cuda or cuda:N")->capture_default_str();
  cmd.add_option("--attention-backend", f.attention_backend, "Attention backend (default: cpu, or cuda on a GPU)");
  cmd.add_option("--page-size", f.page_size, "KV cache page size: a power of two, at most 256 or --max-context-len rounded up to a power of two")
      ->capture_default_str();
  cmd.add_option("--max-context-len", f.max_context_len,
                 "Longest context (prompt + output) of one request (default: the model's, at most 8192)");
  cmd.add_option("--kv-cache-dtype", f.kv_cache_dtype,
                 "auto (f32 on the CPU, bf16 on a GPU and for MLA models), f32, bf16, f16 or fp8_e4m3 (MLA models: "
                 "bf16, or fp8_e4m3 for 656-byte fp8_ds_mla rows)")
      ->capture_default_str();
  cmd.add_option("--kv-cache-tokens", f.kv_cache_tokens,
                 "KV cache size in tokens, at least one full context (default: max-running-requests full contexts, "
                 "at most 4 GiB); rounded up to whole pages");
  cmd.add_option("--max-running-requests", f.max_running_requests, "Requests decoding at once")->capture_default_str();
  cmd.add_option("--max-queued-requests", f.max_queued_requests, "Waiting requests beyond which new ones are refused")
      ->capture_default_str();
  cmd.add_option("--chunked-prefill-size", f.chunked_prefill_size,
                 "Prompt tokens per step; longer prompts are prefilled in chunks (0: no chunking)")
      ->capture_default_str();
  cmd.add_flag("--disable-radix-cache", f.disable_radix_cache, "Do not reuse the KV of shared prompt prefixes");
  cmd.add_flag("--disable-mixed-chunk", f.disable_mixed_chunk,
               "Run prefill chunks in steps of their own instead of together with decodes");
  cmd.add_option("--schedule-conservativeness", f.schedule_conservativeness,
                 "KV reserved for running requests' future tokens at admission (lower admits more, retracts more)")
      ->capture_default_str();
  cmd.add_flag("--enable-deterministic-inference", f.deterministic,
               "Batch-invariant results: a request's output does not depend on its batch (slower GPU prefill)");
  cmd.add_option("--tp-size", f.tp_size,
                 "Tensor parallelism: split the model over this many GPUs (cuda:0 .. cuda:N-1) of this machine")
      ->capture_default_str();
  cmd.add_flag("--disable-cuda-graph", f.disable_cuda_graph, "Run decode steps eagerly instead of as CUDA graphs");
  cmd.add_option("--cuda-graph-max-bs", f.cuda_graph_max_bs, "Largest decode batch captured as a CUDA graph")
      ->capture_default_str();
  cmd.add_option("--cuda-graph-bs", f.cuda_graph_bs, "Decode batch sizes to capture (default: 1 2 4 8 16 24 ...)")
      ->delimiter(',');
  cmd.add_option("--mla-extend-form", f.mla_extend_form,
                 "MLA models on a GPU: prefill in the absorbed or expanded form, or auto (the cheaper per step)")
      ->capture_default_str();
  cmd.add_option("--fp8-expert-weights", f.fp8_expert_weights,
                 "An fp8 checkpoint's experts on a GPU: bf16 (dequantized; faster in this build) or fp8 (half the "
                 "memory)")
      ->capture_default_str();
  cmd.add_flag("--enable-double-sparsity", f.enable_double_sparsity,
               "Decode long requests over heavy tokens chosen from a few key channels (needs "
               "--ds-channel-config-path; decode steps run without CUDA graphs)");
  cmd.add_option("--ds-channel-config-path", f.ds_channel_config_path,
                 "Double sparsity: the label channels per layer and KV head (tools/ds_channel_config.py writes one)");
  cmd.add_option("--ds-heavy-channel-num", f.ds_heavy_channel_num, "Double sparsity: label channels per KV head")
      ->capture_default_str();
  cmd.add_option("--ds-heavy-token-num", f.ds_heavy_token_num, "Double sparsity: tokens each KV head attends to")
      ->capture_default_str();
  cmd.add_option("--ds-sparse-decode-threshold", f.ds_sparse_decode_threshold,
                 "Double sparsity: requests with a shorter context attend to every token")
      ->capture_default_str();
  cmd.add_option("--ds-heavy-channel-type", f.ds_heavy_channel_type,
                 "Double sparsity: the file's channel ranking to use: q, k or qk")
      ->capture_default_str();
  cmd.add_option("--speculative-algorithm", f.speculative_algorithm,
                 "EAGLE or EAGLE3 tree speculative decoding (default: off)");
  cmd.add_option("--draft-model", f.draft_model,
                 "The EAGLE / EAGLE-3 head's folder (default with the shipped model: its shipped head)");
  cmd.add_option("--speculative-num-steps", f.speculative_num_steps,
                 fmt::format("Draft steps per cycle, 1 to {} (default 7)", SpecParams::kMaxNumSteps));
  cmd.add_option("--speculative-eagle-topk", f.speculative_eagle_topk,
                 fmt::format("Branching of the draft tree, 1 to {} (default 1: a chain)", SpecParams::kMaxTopk));
  cmd.add_option("--speculative-num-draft-tokens", f.speculative_num_draft_tokens,
                 fmt::format("Tree nodes verified per cycle, the root included: num-steps + 1 when topk is 1, else 2 to "
                             "min({}, 1 + topk + (num-steps - 1) topk^2) (default 8)",
                             SpecParams::kMaxDraftTokens));
  cmd.add_option("--speculative-policy", f.speculative_policy,
                 "fixed: every cycle drafts the configured shape; auto: before each cycle, the shape (a chain cut "
                 "short, the configured tree, or no drafting at all) with the most expected tokens/s for the batch, "
                 "from costs measured by the engine and each request's acceptance")
      ->capture_default_str();
  cmd.add_option("--speculative-admission-group", f.speculative_admission_group,
                 "While speculating, admit waiting requests once this many rows are free (each admission is a "
                 "prefill step in which no row decodes); 0 (default): sized from the measured prefill and cycle "
                 "times; 1: as rows free");
}

EngineOptions engine_options(const EngineFlags& f) {
  EngineOptions o;
  o.runner.device = parse_device(f.device);
  o.runner.attention_backend = f.attention_backend;
  o.runner.page_size = f.page_size;
  o.runner.max_context_len = f.max_context_len;
  if (f.kv_cache_dtype != "auto") o.runner.kv_dtype = parse_dtype(f.kv_cache_dtype);
  o.runner.kv_cache_tokens = f.kv_cache_tokens;
  o.runner.max_running_requests = f.max_running_requests;
  o.runner.cuda_graph = !f.disable_cuda_graph;
  o.runner.deterministic = f.deterministic;
  o.runner.tp_size = f.tp_size;
  o.runner.cuda_graph_max_bs = f.cuda_graph_max_bs;
  o.runner.cuda_graph_batch_sizes = f.cuda_graph_bs;
  o.runner.mla_extend_form = parse_mla_extend_form(f.mla_extend_form);
  SPECULA_CHECK(f.fp8_expert_weights == "bf16" || f.fp8_expert_weights == "fp8",
                "--fp8-expert-weights {}: allowed bf16, fp8", f.fp8_expert_weights);
  o.runner.fp8_experts = f.fp8_expert_weights == "fp8";
  const bool ds_flags = !f.ds_channel_config_path.empty();
  SPECULA_CHECK(!ds_flags || f.enable_double_sparsity, "--ds-channel-config-path needs --enable-double-sparsity");
  o.runner.double_sparsity = {f.enable_double_sparsity, f.ds_channel_config_path, f.ds_heavy_channel_num,
                              f.ds_heavy_token_num, f.ds_sparse_decode_threshold, f.ds_heavy_channel_type};
  o.scheduler.max_queued_requests = f.max_queued_requests;
  o.scheduler.chunked_prefill_size = f.chunked_prefill_size;
  o.scheduler.disable_radix_cache = f.disable_radix_cache;
  o.scheduler.enable_mixed_chunk = !f.disable_mixed_chunk;
  o.scheduler.schedule_conservativeness = f.schedule_conservativeness;
  const SpecPolicyKind policy = parse_spec_policy(f.speculative_policy);
  const bool spec_flags = !f.draft_model.empty() || f.speculative_num_steps || f.speculative_eagle_topk ||
                          f.speculative_num_draft_tokens || f.speculative_admission_group;
  SPECULA_CHECK(!spec_flags || !f.speculative_algorithm.empty(),
                "--draft-model and --speculative-* need --speculative-algorithm EAGLE or EAGLE3");
  if (!f.speculative_algorithm.empty()) {
    EagleOptions e;
    e.kind = parse_eagle_kind(f.speculative_algorithm);
    if (!f.draft_model.empty()) {
      e.draft_model = f.draft_model;
    } else {
      SPECULA_CHECK(f.model.empty(), "--speculative-algorithm with --model needs --draft-model (the head trained for it)");
      e.draft_model = shipped_model(e.kind == EagleKind::EAGLE ? "specula-byte-6m-eagle" : "specula-byte-6m-eagle3");
    }
    // Unset flags keep EagleOptions' defaults, except that a chain (topk 1) needs num_steps + 1 tokens.
    SpecParams& p = e.params;
    if (f.speculative_num_steps) p.num_steps = *f.speculative_num_steps;
    if (f.speculative_eagle_topk) p.topk = *f.speculative_eagle_topk;
    if (f.speculative_num_draft_tokens) p.num_draft_tokens = *f.speculative_num_draft_tokens;
    else if (p.topk == 1) p.num_draft_tokens = p.num_steps + 1;
    p.validate();
    e.policy = policy;
    o.speculative = e;
    if (f.speculative_admission_group) {
      SPECULA_CHECK(*f.speculative_admission_group >= 0,
                    "--speculative-admission-group {} is not valid; it must be >= 1, or 0 to size groups from "
                    "measured times",
                    *f.speculative_admission_group);
      o.scheduler.speculative_admission_group = *f.speculative_admission_group;
    }
  }
  return o;
}

std::filesystem::path model_folder(const EngineFlags& f) {
  if (!f.model.empty()) return f.model;
  return shipped_model("specula-byte-6m");
}

std::filesystem::path shipped_model(const std::string& folder) {
  const std::filesystem::path name = std::filesystem::path("models") / folder;
  std::vector<std::filesystem::path> candidates = {std::filesystem::current_path() / name};
  char exe[4096];
  const ssize_t len = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (len > 0) {
    exe[len] = '\0';
    const auto bin = std::filesystem::path(exe).parent_path();
    candidates.push_back(bin / ".." / ".." / ".." / name);
    candidates.push_back(bin / ".." / name);
  }
  candidates.push_back(std::filesystem::path(SPECULA_SOURCE_DIR) / name);
  for (const auto& c : candidates) {
    if (std::filesystem::exists(c / "config.json")) return std::filesystem::weakly_canonical(c);
  }
  SPECULA_CHECK(false, "the shipped model {} was not found (give its folder explicitly)", name.string());
  return {};
}

}  // namespace specula
