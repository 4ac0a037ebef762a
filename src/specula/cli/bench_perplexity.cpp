#include "specula/cli/bench_perplexity.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "specula/cli/engine_flags.h"
#include "specula/cli/json_file.h"
#include "specula/core/error.h"
#include "specula/runtime/engine.h"

namespace specula {

namespace {

struct Options {
  EngineFlags engine;
  std::string text;
  std::string json_path;
  int window = 0;
  int windows = 8;
  int prefill = 1;
};

// -log softmax(logits)[target], in double.
double nll(const float* logits, int vocab, int32_t target) {
  double top = -INFINITY;
  for (int i = 0; i < vocab; ++i) top = std::max(top, static_cast<double>(logits[i]));
  double sum = 0.0;
  for (int i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - top);
  return top + std::log(sum) - static_cast<double>(logits[target]);
}

int run(const Options& o) {
  check_json_path(o.json_path);
  SPECULA_CHECK(o.windows >= 1, "--windows {} is not valid; it must be >= 1", o.windows);
  EngineOptions eo = engine_options(o.engine);
  SPECULA_CHECK(!eo.speculative, "bench perplexity scores the target alone; drop --speculative-algorithm");
  eo.background_thread = false;
  eo.runner.max_running_requests = o.windows;
  const std::filesystem::path folder = model_folder(o.engine);
  Engine engine(folder, eo);
  SPECULA_CHECK(engine.tokenizer() != nullptr, "--model {} has no tokenizer", folder.string());
  ModelRunner& runner = engine.runner();

  const std::filesystem::path text_path = o.text.empty() ? folder / "README.md" : std::filesystem::path(o.text);
  std::ifstream in(text_path, std::ios::binary);
  SPECULA_CHECK(in.good(), "--text {}: cannot read the file", text_path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  const std::vector<int32_t> ids = engine.tokenizer()->encode(ss.str());
  const int window = o.window > 0 ? o.window : runner.max_context_len();
  SPECULA_CHECK(window >= 2 && window <= runner.max_context_len(),
                "--window {} is not valid; allowed 2 to the context length {}", window, runner.max_context_len());
  SPECULA_CHECK(o.prefill >= 1 && o.prefill < window, "--prefill {} is not valid; allowed 1 to --window - 1 ({})",
                o.prefill, window - 1);
  SPECULA_CHECK(static_cast<int64_t>(ids.size()) >= window, "--text {} has {} tokens; --window {} needs more",
                text_path.string(), ids.size(), window);
  const int n = o.windows;
  const int64_t room = static_cast<int64_t>(ids.size()) - window;

  // Window w: tokens [start_w, start_w + window), evenly spread over the text.
  std::vector<int64_t> starts;
  std::vector<std::vector<int32_t>> slots;
  const std::vector<int32_t> rows = runner.req_pool().alloc(n).value();
  for (int w = 0; w < n; ++w) {
    starts.push_back(n == 1 ? 0 : room * w / (n - 1));
    auto s = runner.allocator().alloc(window);
    SPECULA_CHECK(s.has_value(), "the KV cache cannot hold {} windows of {} tokens; lower --windows", n, window);
    runner.req_pool().write(rows[static_cast<size_t>(w)], 0, *s);
    slots.push_back(std::move(*s));
  }
  auto token = [&](int w, int t) { return ids[static_cast<size_t>(starts[static_cast<size_t>(w)] + t)]; };

  const int vocab = runner.config().vocab_size;
  const int threshold = eo.runner.double_sparsity.enabled ? eo.runner.double_sparsity.sparse_decode_threshold : 0;
  double total = 0.0, long_total = 0.0;
  int64_t count = 0, long_count = 0;
  std::vector<float> logits;
  const auto t0 = std::chrono::steady_clock::now();
  for (int t = o.prefill - 1; t < window - 1; ++t) {
    ForwardBatch b;
    b.forward_mode = t == o.prefill - 1 ? ForwardMode::EXTEND : ForwardMode::DECODE;
    b.batch_size = n;
    const int first = b.forward_mode == ForwardMode::EXTEND ? 0 : t;
    for (int w = 0; w < n; ++w) {
      b.req_pool_indices.push_back(rows[static_cast<size_t>(w)]);
      b.seq_lens.push_back(t + 1);
      if (b.forward_mode == ForwardMode::EXTEND) {
        b.extend_prefix_lens.push_back(0);
        b.extend_seq_lens.push_back(t + 1);
      }
      for (int i = first; i <= t; ++i) {
        b.input_ids.push_back(token(w, i));
        b.positions.push_back(i);
        b.out_cache_loc.push_back(slots[static_cast<size_t>(w)][static_cast<size_t>(i)]);
      }
    }
    runner.forward(b, logits);
    // Row w predicts token t + 1 with t + 1 tokens of context.
    for (int w = 0; w < n; ++w) {
      const double loss = nll(logits.data() + static_cast<size_t>(w) * vocab, vocab, token(w, t + 1));
      total += loss;
      ++count;
      if (threshold > 0 && t + 1 >= threshold) {
        long_total += loss;
        ++long_count;
      }
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double mean = total / static_cast<double>(count);
  fmt::print("specula bench perplexity  model={}  device={}  text={}  windows={} x {} tokens (prefill {})\n",
             folder.filename().string(), eo.runner.device.str(), text_path.filename().string(), n, window, o.prefill);
  if (eo.runner.double_sparsity.enabled) {
    const DoubleSparsityOptions& d = eo.runner.double_sparsity;
    fmt::print("double sparsity: {} {} channels per KV head, {} heavy tokens, threshold {}\n", d.heavy_channel_num,
               d.heavy_channel_type, d.heavy_token_num, d.sparse_decode_threshold);
  } else {
    fmt::print("dense attention\n");
  }
  fmt::print("tokens scored {}  mean loss {:.5f} nats/token  perplexity {:.4f}  ({:.1f} s)\n", count, mean,
             std::exp(mean), seconds);
  if (long_count > 0) {
    fmt::print("of which with context >= {}: {} tokens, mean loss {:.5f}, perplexity {:.4f}\n", threshold, long_count,
               long_total / static_cast<double>(long_count), std::exp(long_total / static_cast<double>(long_count)));
  }
  if (!o.json_path.empty()) {
    nlohmann::json j = {{"model", folder.string()},
                        {"device", eo.runner.device.str()},
                        {"text", text_path.string()},
                        {"windows", n},
                        {"window", window},
                        {"prefill", o.prefill},
                        {"double_sparsity", eo.runner.double_sparsity.enabled},
                        {"tokens", count},
                        {"mean_loss", mean},
                        {"perplexity", std::exp(mean)}};
    if (long_count > 0) {
      j["long_context_threshold"] = threshold;
      j["long_tokens"] = long_count;
      j["long_mean_loss"] = long_total / static_cast<double>(long_count);
    }
    write_json_file(o.json_path, j);
  }
  return 0;
}

}  // namespace

void add_bench_perplexity_command(CLI::App& bench) {
  auto o = std::make_shared<Options>();
  CLI::App* cmd = bench.add_subcommand(
      "perplexity", "The model's loss on a text, each prediction after the prefill made by a decode step");
  add_engine_flags(*cmd, o->engine);
  cmd->add_option("--text", o->text, "UTF-8 text to score (default: the model folder's README.md)");
  cmd->add_option("--window", o->window, "Tokens per window (default: the context length)");
  cmd->add_option("--windows", o->windows, "Windows of the text, scored side by side")->capture_default_str();
  cmd->add_option("--prefill", o->prefill, "Tokens of each window given as a prefill before the decode steps")
      ->capture_default_str();
  cmd->add_option("--json", o->json_path, "Also write the figures as JSON to this file");
  cmd->callback([o] { run(*o); });
}

}  // namespace specula
