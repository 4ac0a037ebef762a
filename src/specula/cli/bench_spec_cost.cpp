// `specula bench spec-cost`.
#include "specula/cli/bench_spec_cost.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "specula/cli/json_file.h"
#include "specula/core/device_memory.h"
#include "specula/core/error.h"
#include "specula/model/synthetic.h"
#include "specula/runtime/engine.h"
#include "specula/speculative/spec_calibration.h"

#ifdef SPECULA_HAS_CUDA
#include "specula/cli/cuda_ceilings.h"
#endif

namespace specula {

namespace {

struct Options {
  std::string synthetic = "llama3-8b";
  std::string device = "auto";
  std::vector<int> batch_sizes = {1, 2, 4, 8, 16, 32, 64};
  int context_len = 512;
  int num_steps = 7;
  int topk = 1;
  int num_draft_tokens = 8;
  int repeats = 5;
  std::string policy = "auto";
  std::string json_path;
};

void run(const Options& o) {
  check_json_path(o.json_path);
  const Device device = parse_device(o.device == "auto" ? (cuda_device_count() > 0 ? "cuda" : "cpu") : o.device);
  SPECULA_CHECK(!o.batch_sizes.empty(), "--batch-sizes needs at least one size");
  for (int bs : o.batch_sizes) SPECULA_CHECK(bs >= 1, "--batch-sizes {} is not valid; sizes must be >= 1", bs);
  SPECULA_CHECK(o.context_len >= 2, "--context-len {} is not valid; it must be >= 2", o.context_len);
  SPECULA_CHECK(o.repeats >= 1, "--repeats {} is not valid; it must be >= 1", o.repeats);
  const ModelConfig config = synthetic_config(o.synthetic);
  SPECULA_CHECK(!config.is_mla(), "speculative decoding needs a Llama-family target; synthetic {} uses MLA",
                o.synthetic);
  const SyntheticWeights weights(config, 7);
  const double need = 2.0 * static_cast<double>(weights.total_bytes());
  const double ram = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  SPECULA_CHECK(need < 0.7 * ram, "synthetic {} needs {:.1f} GB of f32 weights on the CPU; this machine has {:.1f} GB",
                o.synthetic, need / 1e9, ram / 1e9);
  const int most = *std::max_element(o.batch_sizes.begin(), o.batch_sizes.end());

  EngineOptions eo;
  eo.background_thread = false;
  eo.runner.device = device;
  eo.runner.max_context_len = o.context_len + 64;
  eo.runner.max_running_requests = most;
  eo.runner.cuda_graph_max_bs = most;
  eo.runner.cuda_graph_batch_sizes = o.batch_sizes;
  EagleOptions spec;
  spec.kind = EagleKind::EAGLE3;
  spec.synthetic_head = true;
  spec.params = SpecParams{o.num_steps, o.topk, o.num_draft_tokens};
  spec.params.validate();
  // Room for every stand-in request at the largest batch (the automatic size may hold fewer).
  eo.runner.kv_cache_tokens = static_cast<int64_t>(most) * (eo.runner.max_context_len + spec.params.scratch_tokens() + 64);
  spec.policy = parse_spec_policy(o.policy);
  eo.speculative = spec;
  eo.speculative_calibration = false;
  Engine engine(config, weights, eo);
  ModelRunner& runner = engine.runner();
  EagleWorker& worker = *engine.speculative_worker();

  double copy_gbps = 0;
#ifdef SPECULA_HAS_CUDA
  if (device.is_cuda()) copy_gbps = measure_cuda_ceilings(device).copy_tbps * 1e3;
#endif
  const SpecTimings t = time_spec_cycles(worker, runner, SpecTimingOptions{o.batch_sizes, o.context_len, 2, o.repeats, 5},
                                         /*plain=*/true);
  SPECULA_CHECK(!t.plain.empty(), "no batch size of --batch-sizes fits the KV cache and request rows");
  const SpecShape configured{o.num_steps, o.num_draft_tokens};
  auto cycle = [&](int bs, const SpecShape& s) {
    for (const CycleTime& c : t.cycles) {
      if (c.batch_size == bs && c.shape == s) return c.seconds;
    }
    return 0.0;
  };

  const double weight_gb = static_cast<double>(runner.weight_bytes()) / 1e9;
  fmt::print("specula bench spec-cost  synthetic {} + synthetic EAGLE-3 head  device={}  context {} tokens\n", o.synthetic,
             device.str(), t.context_len);
  fmt::print("target weights {:.2f} GB; head: hidden {}, draft vocab {}; configured shape ({}, {}, {})\n", weight_gb,
             synthetic_eagle3_head_config(config).config.hidden_size,
             synthetic_eagle3_head_config(config).draft_vocab_size, o.num_steps, o.topk, o.num_draft_tokens);
  if (copy_gbps > 0) {
    fmt::print("copy ceiling measured now: {:.0f} GB/s -> plain decode bound {:.1f} steps/s (weights only)\n", copy_gbps,
               copy_gbps / weight_gb);
  }
  fmt::print("\n{:>5} {:>10} {:>9} {:>11} {:>9} {:>7} {:>7} {:>7} {:>7} {:>7}\n", "batch", "plain ms", "of bound",
             "cycle ms", "cycle/pl", "x@2", "x@3", "x@4", "x@5", "x@6");
  nlohmann::json rows = nlohmann::json::array();
  std::vector<PlainTime> plain = t.plain;
  std::sort(plain.begin(), plain.end(), [](const PlainTime& a, const PlainTime& b) { return a.batch_size < b.batch_size; });
  for (const PlainTime& p : plain) {
    const double c = cycle(p.batch_size, configured);
    const double bound_s = copy_gbps > 0 ? weight_gb / copy_gbps : 0;
    std::vector<double> x;
    for (int a = 2; a <= 6; ++a) x.push_back(a * p.seconds / c);
    const std::string of_bound = bound_s > 0 ? fmt::format("{:.0f}%", 100.0 * bound_s / p.seconds) : "n/a";
    fmt::print("{:>5} {:>10.3f} {:>9} {:>11.3f} {:>9.2f} {:>7.2f} {:>7.2f} {:>7.2f} {:>7.2f} {:>7.2f}\n", p.batch_size,
               p.seconds * 1e3, of_bound, c * 1e3, c / p.seconds, x[0], x[1], x[2], x[3], x[4]);
    nlohmann::json shapes = nlohmann::json::object();
    for (const CycleTime& ct : t.cycles) {
      if (ct.batch_size == p.batch_size) shapes[ct.shape.str()] = ct.seconds;
    }
    rows.push_back({{"batch_size", p.batch_size},
                    {"plain_step_s", p.seconds},
                    {"cycle_s", c},
                    {"projected_speedup_by_accept_length", {{"2", x[0]}, {"3", x[1]}, {"4", x[2]}, {"5", x[3]}, {"6", x[4]}}},
                    {"cycle_s_by_shape", shapes}});
  }
  // The configured cycle's parts, each run alone and waited for: where the time goes.
  fmt::print("\nconfigured cycle's parts, each alone (ms): verify = the target over the trees, draft = {} head steps "
             "and the top-k, extend = the head over {} pairs per request\n{:>5} {:>9} {:>9} {:>11} {:>9} {:>9} {:>11}\n",
             o.num_steps - 1, o.num_draft_tokens, "batch", "verify", "draft", "per step", "extend", "sum", "cycle-sum");
  nlohmann::json parts = nlohmann::json::array();
  std::vector<PhaseTime> phases = t.phases;
  std::sort(phases.begin(), phases.end(), [](const PhaseTime& a, const PhaseTime& b) { return a.batch_size < b.batch_size; });
  for (const PhaseTime& ph : phases) {
    const double sum = ph.verify_s + ph.draft_s + ph.extend_s;
    fmt::print("{:>5} {:>9.3f} {:>9.3f} {:>11.3f} {:>9.3f} {:>9.3f} {:>11.3f}\n", ph.batch_size, ph.verify_s * 1e3,
               ph.draft_s * 1e3, o.num_steps > 1 ? ph.draft_s * 1e3 / (o.num_steps - 1) : 0.0, ph.extend_s * 1e3,
               sum * 1e3, (cycle(ph.batch_size, configured) - sum) * 1e3);
    parts.push_back({{"batch_size", ph.batch_size}, {"verify_s", ph.verify_s}, {"draft_s", ph.draft_s}, {"extend_s", ph.extend_s}});
  }
  // What the auto policy sees: one cycle of every shape it may pick, per batch size.
  fmt::print("\ncycle ms by shape (off: the plain step)\n{:>5}", "batch");
  for (const SpecShape& s : worker.policy().shapes()) fmt::print(" {:>9}", s.str());
  fmt::print("\n");
  for (const PlainTime& p : plain) {
    fmt::print("{:>5}", p.batch_size);
    for (const SpecShape& s : worker.policy().shapes()) fmt::print(" {:>9.3f}", cycle(p.batch_size, s) * 1e3);
    fmt::print("\n");
  }
  if (!o.json_path.empty()) {
    write_json_file(o.json_path, {{"synthetic", o.synthetic},
                                  {"device", device.str()},
                                  {"context_len", t.context_len},
                                  {"num_steps", o.num_steps},
                                  {"topk", o.topk},
                                  {"num_draft_tokens", o.num_draft_tokens},
                                  {"copy_gbytes_per_second", copy_gbps},
                                  {"weight_bytes", runner.weight_bytes()},
                                  {"rows", rows},
                                  {"parts", parts}});
  }
}

}  // namespace

void add_bench_spec_cost_command(CLI::App& bench) {
  auto o = std::make_shared<Options>();
  CLI::App* cmd = bench.add_subcommand(
      "spec-cost", "Speculative decoding's costs at scale: plain steps and cycles of a synthetic target and EAGLE-3 head");
  cmd->add_option("--synthetic", o->synthetic, "The target's shape: llama3-8b, llama3.2-1b, tiny")->capture_default_str();
  cmd->add_option("--device", o->device, "auto (a GPU if there is one), cpu or cuda[:N]")->capture_default_str();
  cmd->add_option("--batch-sizes", o->batch_sizes, "Batch sizes to time")->delimiter(',')->capture_default_str();
  cmd->add_option("--context-len", o->context_len, "KV tokens per request while timing")->capture_default_str();
  cmd->add_option("--speculative-num-steps", o->num_steps, "Draft steps of the configured shape")->capture_default_str();
  cmd->add_option("--speculative-eagle-topk", o->topk, "Its branching")->capture_default_str();
  cmd->add_option("--speculative-num-draft-tokens", o->num_draft_tokens, "Its tree tokens")->capture_default_str();
  cmd->add_option("--speculative-policy", o->policy, "auto: time every shape the auto policy may pick; fixed: the "
                  "configured one only")->capture_default_str();
  cmd->add_option("--repeats", o->repeats, "Timed repeats per case (the median is kept)")->capture_default_str();
  cmd->add_option("--json", o->json_path, "Also write the results as JSON to this file");
  cmd->callback([o] { run(*o); });
}

}  // namespace specula
