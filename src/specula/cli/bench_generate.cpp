// `specula bench generate`.
#include "specula/cli/bench_generate.h"

#include <fmt/format.h>
#include <unistd.h>

#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "specula/cli/cpu_ceilings.h"
#include "specula/cli/json_file.h"
#include "specula/core/error.h"
#include "specula/core/thread_pool.h"
#include "specula/model/synthetic.h"
#include "specula/runtime/generator.h"

#ifdef SPECULA_HAS_CUDA
#include "specula/cli/cuda_ceilings.h"
#endif

namespace specula {

namespace {

struct Options {
  std::string model;
  std::string synthetic;
  std::string device = "cpu";
  int prompt_len = 256;
  int decode_len = 64;
  int tp_size = 1;
  std::string json_path;
};

void run(const Options& o) {
  check_json_path(o.json_path);
  const Device device = parse_device(o.device);
  SPECULA_CHECK(o.model.empty() != o.synthetic.empty(), "give exactly one of --model and --synthetic");
  SPECULA_CHECK(o.prompt_len >= 1 && o.decode_len >= 1, "--prompt-len {} and --decode-len {} must be positive",
                o.prompt_len, o.decode_len);
  GeneratorOptions go;
  go.device = device;
  go.max_context_len = o.prompt_len + o.decode_len;
  go.tp_size = o.tp_size;
  std::unique_ptr<Generator> gen;
  std::string what;
  if (!o.synthetic.empty()) {
    const ModelConfig config = synthetic_config(o.synthetic);
    const SyntheticWeights weights(config, 7);
    // The host model holds f32 copies (twice the bf16 size): of everything on the CPU; of the
    // embedding and lm_head on a GPU (the layers' matrices go there as they are), once per GPU under
    // tensor parallelism. Refuse what would not fit.
    const double ends = static_cast<double>(config.vocab_size) * config.hidden_size * 2.0 * (config.tie_word_embeddings ? 1 : 2);
    const double need = device.is_cuda() ? 2.0 * ends * o.tp_size : 2.0 * static_cast<double>(weights.total_bytes());
    const double ram = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
    SPECULA_CHECK(need < 0.7 * ram, "synthetic {} needs {:.1f} GB of f32 weights on the CPU; this machine has {:.1f} GB",
                  o.synthetic, need / 1e9, ram / 1e9);
    SPECULA_CHECK(go.max_context_len <= config.max_position_embeddings, "prompt + decode ({}) exceeds the context {}",
                  go.max_context_len, config.max_position_embeddings);
    gen = std::make_unique<Generator>(config, weights, go);
    what = "synthetic " + o.synthetic;
  } else {
    gen = std::make_unique<Generator>(o.model, go);
    what = o.model;
  }
  double copy_gbps = 0;
  if (device.is_cpu()) {
    copy_gbps = measure_cpu_ceilings(default_thread_pool()).copy_gbps;
  } else {
#ifdef SPECULA_HAS_CUDA
    // Each GPU streams its own shard: the slowest GPU's copy rate bounds the step.
    for (int r = 0; r < o.tp_size; ++r) {
      const double gbps = measure_cuda_ceilings(Device::cuda(device.index + r)).copy_tbps * 1e3;
      copy_gbps = r == 0 ? gbps : std::min(copy_gbps, gbps);
    }
#endif
  }

  GenerateRequest r;
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> token(0, gen->config().vocab_size - 1);
  for (int i = 0; i < o.prompt_len; ++i) r.prompt_ids.push_back(token(rng));
  r.max_new_tokens = o.decode_len;
  r.ignore_eos = true;
  gen->generate(r);  // warm-up: page in weights and scratch
  const GenerateResult result = gen->generate(r);
  // On a GPU the same request once more with decode steps launched eagerly, for comparison.
  std::optional<GenerateResult> eager;
  if (!gen->runner().cuda_graph_batch_sizes().empty()) {
    gen->runner().set_use_cuda_graph(false);
    eager = gen->generate(r);
    gen->runner().set_use_cuda_graph(true);
  }

  const double weight_gb = static_cast<double>(gen->runner().weight_bytes()) / 1e9;
  // A mixture of experts reads its top-k and shared experts only.
  // Under tensor parallelism, what the most loaded GPU reads.
  const double read_gb = static_cast<double>(gen->runner().model().decode_weight_bytes_per_gpu()) / 1e9;
  const double bound = copy_gbps / read_gb;  // tokens/s if every step only streamed the weights it reads
  const double prefill_tps = o.prompt_len / result.time_to_first_token_s;
  fmt::print("specula bench generate  {}  device={} tp_size={} threads={}\n", what, device.str(), o.tp_size,
             default_thread_pool().num_threads());
  fmt::print("weights as held: {:.3f} GB ({}), {:.3f} GB read per decode step{}; copy ceiling measured now: {:.1f} GB/s -> "
             "decode bound {:.1f} tok/s\n\n",
             weight_gb, device.is_cpu() ? "f32" : "bf16 matrices where the checkpoint is bf16", read_gb,
             o.tp_size > 1 ? " by each GPU" : "", copy_gbps, bound);
  fmt::print("{:<28} {:>12}\n", "prompt tokens", o.prompt_len);
  fmt::print("{:<28} {:>12.1f}\n", "prefill tok/s", prefill_tps);
  fmt::print("{:<28} {:>12.2f}\n", "time to first token ms", result.time_to_first_token_s * 1e3);
  fmt::print("{:<28} {:>12}\n", "decode tokens", result.output_ids.size());
  fmt::print("{:<28} {:>12.1f}\n", "decode tok/s", result.decode_tokens_per_s);
  fmt::print("{:<28} {:>11.0f}%\n", "of weight-bandwidth bound", 100.0 * result.decode_tokens_per_s / bound);
  if (eager) {
    fmt::print("{:<28} {:>12.1f}\n", "decode tok/s, no CUDA graph", eager->decode_tokens_per_s);
    fmt::print("{:<28} {:>11.0f}%\n", "of weight-bandwidth bound", 100.0 * eager->decode_tokens_per_s / bound);
  }
  if (!o.json_path.empty()) {
    nlohmann::json j = {{"model", what},
                        {"prompt_tokens", o.prompt_len},
                        {"decode_tokens", result.output_ids.size()},
                        {"prefill_tokens_per_s", prefill_tps},
                        {"time_to_first_token_s", result.time_to_first_token_s},
                        {"decode_tokens_per_s", result.decode_tokens_per_s},
                        {"weight_bytes", gen->runner().weight_bytes()},
                        {"decode_weight_bytes", gen->runner().decode_weight_bytes()},
                        {"copy_gbytes_per_second", copy_gbps},
                        {"decode_bound_tokens_per_s", bound},
                        {"tp_size", o.tp_size},
                        {"cuda_graph", eager.has_value()}};
    if (eager) j["decode_tokens_per_s_no_cuda_graph"] = eager->decode_tokens_per_s;
    write_json_file(o.json_path, j);
  }
}

}  // namespace

void add_bench_generate_command(CLI::App& bench) {
  auto o = std::make_shared<Options>();
  CLI::App* cmd = bench.add_subcommand("generate", "Prefill and decode speed of one request");
  cmd->add_option("--model", o->model, "Hugging Face model folder");
  cmd->add_option("--synthetic", o->synthetic,
                  "A random-weight model of a named shape: llama3-8b, llama3.2-1b, deepseek-v2-lite, deepseek-v2-lite-dense, qwen3-30b-a3b, tiny");
  cmd->add_option("--device", o->device, "cpu")->capture_default_str();
  cmd->add_option("--prompt-len", o->prompt_len, "Prompt tokens")->capture_default_str();
  cmd->add_option("--decode-len", o->decode_len, "Generated tokens")->capture_default_str();
  cmd->add_option("--tp-size", o->tp_size, "Tensor parallelism over this many GPUs")->capture_default_str();
  cmd->add_option("--json", o->json_path, "Also write the results as JSON to this file");
  cmd->callback([o] { run(*o); });
}

}  // namespace specula
