// HttpServer: the OpenAI-compatible HTTP API over an Engine (cpp-httplib underneath).
// Endpoints: POST /v1/completions, POST /v1/chat/completions (both streamed as Server-Sent Events
// when asked), GET /v1/models, GET /health, GET /metrics (Prometheus), POST /tokenize,
// POST /detokenize, and the built-in chat page at GET /. With an API key every endpoint but
// /health needs "Authorization: Bearer KEY". Errors are OpenAI's error JSON with the right status.
//
// Lifecycle: bind(), then serve() blocks until shutdown() (called from another thread, e.g. on
// SIGINT/SIGTERM): new requests are refused, in-flight ones get `shutdown_grace_s` to finish, the
// rest are cancelled, and serve() returns.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "specula/server/chat_template.h"
#include "specula/runtime/engine.h"
#include "specula/server/metrics.h"

namespace httplib {
class Server;
class DataSink;
struct Request;
struct Response;
}  // namespace httplib

namespace specula::server {

enum class LogLevel { debug, info, warning, error };
LogLevel parse_log_level(const std::string& text);

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 30000;                       // 0: any free port (bind() returns it)
  std::string api_key;                    // empty: no authentication
  std::string served_model_name;          // the "model" clients name; must not be empty
  size_t max_request_bytes = 8u << 20;    // larger bodies get 413
  int threads = 128;                      // connections served at once (each holds a thread)
  int read_timeout_s = 30;                // a client that sends nothing for this long is dropped
  int write_timeout_s = 60;               // a client that reads nothing for this long is dropped
  int keep_alive_timeout_s = 5;
  double shutdown_grace_s = 30;           // in-flight requests' time to finish on shutdown
  LogLevel log_level = LogLevel::info;
  int max_context_len = 0;                // the engine's, for /v1/models and length errors
};

class HttpServer {
 public:
  HttpServer(Engine& engine, ServerOptions options, std::optional<ChatTemplate> chat_template);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds the listening socket; returns the port. Throws specula::Error naming host and port.
  int bind();
  // Serves until shutdown() has drained every connection.
  void serve();
  // Thread-safe; returns at once. Stops accepting, then cancels what is left after the grace period.
  void shutdown();

 private:
  // What a handler tells run() about its response (run() and the handler share a thread).
  struct RequestNote {
    bool streamed = false;        // the stream counts and logs itself when it ends
    int completion_tokens = -1;   // for the log line
  };
  static thread_local RequestNote note_;
  using Handler = void (HttpServer::*)(const httplib::Request&, httplib::Response&);

  void routes();
  // Runs a handler: authentication, errors as JSON, metrics and the log line.
  void run(const char* endpoint, Handler handler, const httplib::Request& req, httplib::Response& res);
  void log(LogLevel level, const std::string& line) const;

  void health(const httplib::Request&, httplib::Response&);
  void models(const httplib::Request&, httplib::Response&);
  void metrics(const httplib::Request&, httplib::Response&);
  void tokenize(const httplib::Request&, httplib::Response&);
  void detokenize(const httplib::Request&, httplib::Response&);
  void completions(const httplib::Request&, httplib::Response&);
  void chat_completions(const httplib::Request&, httplib::Response&);
  void chat_page(const httplib::Request&, httplib::Response&);
  struct Generation;  // one generation request's state (generation.cpp)
  void generate(const httplib::Request& req, httplib::Response& res, bool chat);
  // Writes a generation's events as SSE until every choice has finished; false when the client
  // went away (the caller then cancels what is left).
  bool stream(Generation& gen, bool chat, httplib::DataSink& sink, int64_t& completion_tokens);

  // Engine ids of running requests, so that shutdown can cancel them.
  void track(uint64_t id);
  void untrack(uint64_t id);

  Engine& engine_;
  ServerOptions options_;
  std::optional<ChatTemplate> chat_template_;
  std::unique_ptr<httplib::Server> http_;
  Metrics metrics_;
  int64_t created_ = 0;
  std::atomic<bool> stopping_{false};
  int listen_fd_ = -1;
  std::mutex inflight_mu_;
  std::set<uint64_t> inflight_;
  std::mutex shutdown_mu_;  // guards shutdown_thread_ (assigned by shutdown(), joined by serve())
  std::thread shutdown_thread_;
  std::atomic<bool> listening_done_{false};
};

}  // namespace specula::server
