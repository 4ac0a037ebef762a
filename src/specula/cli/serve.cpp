// `specula serve`: engine flags as `generate` takes them, server flags with SGLang's names and
// defaults (127.0.0.1:30000). SIGINT / SIGTERM shut the server down gracefully, exit status 0.
#include "specula/cli/serve.h"

#include <fmt/format.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <ctime>
#include <memory>
#include <thread>

#include "specula/cli/engine_flags.h"
#include "specula/core/error.h"
#include "specula/model/synthetic.h"
#include "specula/server/chat_template.h"
#include "specula/runtime/engine.h"
#include "specula/server/http_server.h"

namespace specula {

namespace {

struct Options {
  EngineFlags engine;
  server::ServerOptions server;
  std::string log_level = "info";
  std::string chat_template;
  std::string synthetic;
  int timeout_s = 60;
};

// Set by SIGINT / SIGTERM (any thread may take them: OpenBLAS starts its threads before main, so
// no signal mask covers every thread); a watcher thread polls it.
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }

void run(Options& o) {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  // Interrupted system calls resume: cpp-httplib treats an interrupted accept() as fatal.
  action.sa_flags = SA_RESTART;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  // A client that closes its socket mid-write must not kill the process.
  signal(SIGPIPE, SIG_IGN);

  o.server.log_level = server::parse_log_level(o.log_level);
  o.server.read_timeout_s = o.timeout_s;
  o.server.write_timeout_s = o.timeout_s;
  EngineOptions eo = engine_options(o.engine);
  eo.background_thread = true;
  // Debug logging includes the speculative policy's changes of draft shape, with why.
  eo.scheduler.log_spec_choices = o.server.log_level == server::LogLevel::debug;
  std::unique_ptr<Engine> engine_ptr;
  std::optional<ChatTemplate> chat_template;
  std::string what;
  if (!o.synthetic.empty()) {
    // Random weights of a named shape, for benchmarks; outputs decode to printable bytes.
    SPECULA_CHECK(o.engine.model.empty(), "give at most one of --model and --synthetic");
    const ModelConfig config = synthetic_config(o.synthetic);
    const SyntheticWeights weights(config, 7);
    engine_ptr = std::make_unique<Engine>(config, weights, eo, std::make_unique<Tokenizer>(Tokenizer::synthetic(config.vocab_size)));
    what = "synthetic-" + o.synthetic;
    if (!o.chat_template.empty()) chat_template = ChatTemplate::load({}, o.chat_template);
  } else {
    const auto folder = model_folder(o.engine);
    what = o.engine.model.empty() ? folder.filename().string() : o.engine.model;
    chat_template = ChatTemplate::load(folder, o.chat_template);
    engine_ptr = std::make_unique<Engine>(folder, eo);
  }
  Engine& engine = *engine_ptr;
  if (o.server.served_model_name.empty()) o.server.served_model_name = what;
  o.server.max_context_len = engine.runner().max_context_len();
  server::HttpServer http(engine, o.server, std::move(chat_template));
  const int port = http.bind();
  if (!chat_template) {
    fmt::print(stderr, "specula: {} has no chat template: /v1/chat/completions answers 400 (give --chat-template)\n",
               what);
  }
  fmt::print(stderr, "specula: listening on http://{}:{}\n", o.server.host, port);

  std::atomic<bool> done{false};
  std::thread waiter([&] {
    while (!done) {
      if (g_stop_signal != 0) {
        fmt::print(stderr, "specula: {}: shutting down\n", g_stop_signal == SIGINT ? "SIGINT" : "SIGTERM");
        http.shutdown();
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  http.serve();
  done = true;
  waiter.join();
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("serve", "Serve an OpenAI-compatible HTTP API");
  add_engine_flags(*cmd, o->engine);
  cmd->add_option("--synthetic", o->synthetic,
                  "Serve a random-weight model of a named shape instead of --model (benchmarks; text is printable "
                  "bytes)");
  cmd->add_option("--host", o->server.host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", o->server.port, "Port to listen on (0: any free port)")->capture_default_str();
  cmd->add_option("--api-key", o->server.api_key,
                  "Require 'Authorization: Bearer KEY' on every endpoint but /health");
  cmd->add_option("--served-model-name", o->server.served_model_name,
                  "The model name clients use (default: --model as given, or the shipped model's folder name)");
  cmd->add_option("--chat-template", o->chat_template,
                  "A Jinja chat template file (default: the model's chat_template.jinja or tokenizer_config.json's)");
  cmd->add_option("--max-request-bytes", o->server.max_request_bytes, "Largest request body accepted (413 above)")
      ->capture_default_str();
  cmd->add_option("--threads", o->server.threads, "Connections served at once")->capture_default_str();
  cmd->add_option("--timeout", o->timeout_s, "Seconds a connection may stay silent while reading or writing")
      ->capture_default_str();
  cmd->add_option("--shutdown-grace-s", o->server.shutdown_grace_s,
                  "On SIGINT/SIGTERM, seconds in-flight requests get to finish before they are cancelled")
      ->capture_default_str();
  cmd->add_option("--log-level", o->log_level, "debug, info, warning or error")->capture_default_str();
  cmd->callback([o] { run(*o); });
}

}  // namespace specula
