// HttpServer: routes, authentication, error JSON, logging, metrics and the shutdown sequence.
// The generation endpoints are in generation.cpp.
#include "specula/server/http_server.h"

#include <fmt/format.h>
#include <httplib.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <thread>

#include "specula/core/error.h"
#include "specula/server/chat_page.h"
#include "specula/server/openai_request.h"
#include "specula/server/openai_response.h"

namespace specula::server {

thread_local HttpServer::RequestNote HttpServer::note_;

namespace {

// A request path for messages and the log: control bytes (a decoded %0A) and bytes outside ASCII
// as \xNN, so a client can neither break log lines nor produce invalid UTF-8.
std::string printable(const std::string& path) {
  std::string out;
  for (unsigned char c : path.substr(0, 200)) {
    if (c < 0x20 || c >= 0x7f) out += fmt::format("\\x{:02x}", c);
    else out += static_cast<char>(c);
  }
  return out;
}

}  // namespace

LogLevel parse_log_level(const std::string& text) {
  if (text == "debug") return LogLevel::debug;
  if (text == "info") return LogLevel::info;
  if (text == "warning") return LogLevel::warning;
  if (text == "error") return LogLevel::error;
  SPECULA_CHECK(false, "--log-level '{}' is not valid; valid: debug, info, warning, error", text);
  return LogLevel::info;
}

HttpServer::HttpServer(Engine& engine, ServerOptions options, std::optional<ChatTemplate> chat_template)
    : engine_(engine), options_(std::move(options)), chat_template_(std::move(chat_template)),
      http_(std::make_unique<httplib::Server>()) {
  SPECULA_CHECK(!options_.served_model_name.empty(), "the served model name is empty");
  SPECULA_CHECK(options_.port >= 0 && options_.port <= 65535, "--port {} is not valid; it must be in [0, 65535]",
                options_.port);
  SPECULA_CHECK(options_.threads >= 1 && options_.threads <= 4096, "--threads {} is not valid; it must be in [1, 4096]",
                options_.threads);
  SPECULA_CHECK(options_.max_request_bytes >= 1024, "--max-request-bytes {} is not valid; it must be >= 1024",
                options_.max_request_bytes);
  SPECULA_CHECK(options_.read_timeout_s >= 1 && options_.write_timeout_s >= 1,
                "--timeout {}/{} s is not valid; timeouts must be >= 1 s", options_.read_timeout_s,
                options_.write_timeout_s);
  SPECULA_CHECK(options_.shutdown_grace_s >= 0, "--shutdown-grace-s {} is not valid; it must be >= 0",
                options_.shutdown_grace_s);
  created_ = static_cast<int64_t>(std::time(nullptr));
  const int threads = options_.threads;
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  http_->set_payload_max_length(options_.max_request_bytes);
  http_->set_read_timeout(options_.read_timeout_s, 0);
  http_->set_write_timeout(options_.write_timeout_s, 0);
  http_->set_keep_alive_timeout(options_.keep_alive_timeout_s);
  // Each SSE chunk goes out when it is written: with Nagle's algorithm on, the first chunk after
  // the headers waited for the client's delayed ACK (about 40 ms added to time to first token).
  http_->set_tcp_nodelay(true);
  // The listening socket, remembered so bind() can widen its backlog (below); SO_REUSEADDR as
  // httplib's default options set it, so a restarted server can bind at once.
  http_->set_socket_options([this](int fd) {
    int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    listen_fd_ = fd;
  });
  routes();
}

HttpServer::~HttpServer() {
  listening_done_ = true;
  std::lock_guard lk(shutdown_mu_);
  if (shutdown_thread_.joinable()) shutdown_thread_.join();
}

int HttpServer::bind() {
  int port = options_.port;
  if (port == 0) {
    port = http_->bind_to_any_port(options_.host);
    SPECULA_CHECK(port > 0, "cannot listen on {}: no free port", options_.host);
  } else {
    SPECULA_CHECK(http_->bind_to_port(options_.host, port), "cannot listen on {}:{} (in use, or not an address of "
                  "this machine)", options_.host, port);
  }
  // cpp-httplib listens with a backlog of 5: 64 clients connecting at once overflowed it, and each
  // dropped SYN cost its client a 1 s retransmission before the first byte (seen as a 1.3 s median
  // time to first token). Calling listen() again on the socket raises the backlog.
  if (listen_fd_ >= 0) ::listen(listen_fd_, SOMAXCONN);
  options_.port = port;
  return port;
}

void HttpServer::serve() {
  log(LogLevel::info, fmt::format("serving {} on http://{}:{}", options_.served_model_name, options_.host, options_.port));
  // A shutdown asked for before listening (a signal during model load) ends it at once.
  if (!stopping_) http_->listen_after_bind();
  listening_done_ = true;
  std::lock_guard lk(shutdown_mu_);
  if (shutdown_thread_.joinable()) shutdown_thread_.join();
  log(LogLevel::info, "stopped");
}

void HttpServer::shutdown() {
  if (stopping_.exchange(true)) return;
  log(LogLevel::info, fmt::format("shutting down: in-flight requests have {} s to finish", options_.shutdown_grace_s));
  std::lock_guard lk(shutdown_mu_);
  shutdown_thread_ = std::thread([this] {
    // listen_after_bind returns once every connection's handler has returned; handlers of
    // generations end when their requests do, so cancelling is what bounds the wait. stop() is
    // repeated because a stop that comes before the listening loop has started does nothing.
    std::thread stopper([this] {
      while (!listening_done_) {
        http_->stop();
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    });
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(options_.shutdown_grace_s);
    while (std::chrono::steady_clock::now() < deadline) {
      {
        std::lock_guard lk(inflight_mu_);
        if (inflight_.empty()) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    // Requests still running, and any that slip in while the listener closes, are cancelled.
    while (!listening_done_) {
      std::set<uint64_t> left;
      {
        std::lock_guard lk(inflight_mu_);
        left = inflight_;
      }
      if (!left.empty()) log(LogLevel::warning, fmt::format("cancelling {} requests still running", left.size()));
      for (uint64_t id : left) engine_.cancel(id);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    stopper.join();
  });
}

void HttpServer::track(uint64_t id) {
  std::lock_guard lk(inflight_mu_);
  inflight_.insert(id);
}

void HttpServer::untrack(uint64_t id) {
  std::lock_guard lk(inflight_mu_);
  inflight_.erase(id);
}

void HttpServer::log(LogLevel level, const std::string& line) const {
  if (level < options_.log_level) return;
  static const char* kNames[] = {"DEBUG", "INFO", "WARNING", "ERROR"};
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y-%m-%d %H:%M:%S", &tm);
  std::fprintf(stderr, "[%s] %s %s\n", stamp, kNames[static_cast<int>(level)], line.c_str());
}

void HttpServer::routes() {
  auto add = [this](const char* method, const char* path, const char* endpoint, Handler handler) {
    auto fn = [this, endpoint, handler](const httplib::Request& req, httplib::Response& res) {
      run(endpoint, handler, req, res);
    };
    if (std::string(method) == "GET") http_->Get(path, fn);
    else http_->Post(path, fn);
  };
  add("GET", "/health", "/health", &HttpServer::health);
  add("GET", "/v1/models", "/v1/models", &HttpServer::models);
  add("GET", "/metrics", "/metrics", &HttpServer::metrics);
  add("POST", "/tokenize", "/tokenize", &HttpServer::tokenize);
  add("POST", "/detokenize", "/detokenize", &HttpServer::detokenize);
  add("POST", "/v1/completions", "/v1/completions", &HttpServer::completions);
  add("POST", "/v1/chat/completions", "/v1/chat/completions", &HttpServer::chat_completions);
  add("GET", "/", "/", &HttpServer::chat_page);
  // A known path with the wrong method is 405 with Allow, not 404.
  const std::pair<const char*, const char*> known[] = {
      {"/health", "GET"}, {"/v1/models", "GET"}, {"/metrics", "GET"}, {"/tokenize", "POST"}, {"/detokenize", "POST"},
      {"/v1/completions", "POST"}, {"/v1/chat/completions", "POST"}, {"/", "GET"}};
  for (const auto& [path, allowed] : known) {
    auto wrong = [this, path = std::string(path), allowed = std::string(allowed)](const httplib::Request& req,
                                                                                   httplib::Response& res) {
      res.status = 405;
      res.set_header("Allow", allowed);
      res.set_content(to_text(error_json(405, fmt::format("{} {}: method not allowed; use {}", req.method, path, allowed),
                                         "invalid_request_error")),
                      "application/json");
      metrics_.request_done(path, 405);
    };
    if (std::string(allowed) == "GET") {
      http_->Post(path, wrong);
      http_->Put(path, wrong);
      http_->Delete(path, wrong);
    } else {
      http_->Get(path, wrong);
      http_->Put(path, wrong);
      http_->Delete(path, wrong);
    }
  }
  // Unknown paths, bodies over the limit and other transport-level errors get an error JSON too.
  http_->set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    // cpp-httplib calls this outside its own try block: nothing may throw out of it.
    try {
      if (!res.body.empty()) return;
      std::string message = fmt::format("{} {}: HTTP status {}", req.method, printable(req.path), res.status);
      if (res.status == 404) message = fmt::format("{} {}: no such endpoint", req.method, printable(req.path));
      if (res.status == 413) {
        message = fmt::format("the request body is larger than the limit of {} bytes", options_.max_request_bytes);
      }
      res.set_content(to_text(error_json(res.status, message, "invalid_request_error")), "application/json");
      metrics_.request_done("other", res.status);
      log(LogLevel::info, fmt::format("{} {} {}", req.method, printable(req.path), res.status));
    } catch (...) {
      res.set_content(R"({"error":{"message":"bad request","type":"invalid_request_error","param":null,"code":400}})",
                      "application/json");
    }
  });
  http_->set_exception_handler([this](const httplib::Request& req, httplib::Response& res, std::exception_ptr) {
    res.status = 500;
    res.set_content(to_text(error_json(500, "internal server error", "internal_server_error")), "application/json");
    log(LogLevel::error, fmt::format("{} {}: an exception escaped a handler", req.method, printable(req.path)));
  });
}

void HttpServer::run(const char* endpoint, Handler handler, const httplib::Request& req, httplib::Response& res) {
  const auto start = std::chrono::steady_clock::now();
  const std::string path = endpoint;
  note_ = RequestNote{};
  try {
    if (!options_.api_key.empty() && path != "/health") {
      const std::string expected = "Bearer " + options_.api_key;
      if (req.get_header_value("Authorization") != expected) {
        throw HttpError(401, "invalid or missing API key: send 'Authorization: Bearer <key>'", "authentication_error");
      }
    }
    (this->*handler)(req, res);
    if (res.status < 0) res.status = 200;
  } catch (const HttpError& e) {
    res.status = e.status;
    if (e.status == 503) res.set_header("Retry-After", "1");
    res.set_content(to_text(error_json(e.status, e.what(), e.type)),
                    "application/json");
  } catch (const Error& e) {
    res.status = 400;
    res.set_content(to_text(error_json(400, e.what(), "invalid_request_error")),
                    "application/json");
  } catch (const std::exception& e) {
    res.status = 500;
    res.set_content(to_text(error_json(500, e.what(), "internal_server_error")),
                    "application/json");
  }
  // Streams count and log themselves when they end.
  if (note_.streamed && res.status == 200) return;
  metrics_.request_done(path, res.status);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  log(res.status >= 500 ? LogLevel::error : LogLevel::info,
      fmt::format("{} {} {} {:.1f} ms{}", req.method, printable(req.path), res.status, ms,
                  note_.completion_tokens >= 0 ? fmt::format(" {} tokens", note_.completion_tokens) : ""));
}

void HttpServer::health(const httplib::Request&, httplib::Response& res) {
  if (stopping_) throw HttpError(503, "the server is shutting down", "service_unavailable");
  res.set_content(R"({"status":"ok"})", "application/json");
}

void HttpServer::models(const httplib::Request&, httplib::Response& res) {
  const json model = {{"id", options_.served_model_name}, {"object", "model"}, {"created", created_},
                      {"owned_by", "specula"}, {"max_model_len", options_.max_context_len}};
  res.set_content(to_text(json{{"object", "list"}, {"data", json::array({model})}}), "application/json");
}

void HttpServer::metrics(const httplib::Request&, httplib::Response& res) {
  res.set_content(metrics_.render(engine_.stats(), options_.served_model_name), "text/plain; version=0.0.4");
}

void HttpServer::tokenize(const httplib::Request& req, httplib::Response& res) {
  const TokenizeRequest t = parse_tokenize_request(req.body);
  const Tokenizer* tokenizer = engine_.tokenizer();
  if (tokenizer == nullptr) throw HttpError(400, "this model has no tokenizer");
  std::vector<int32_t> ids;
  if (t.prompt) {
    ids = tokenizer->encode(*t.prompt, t.add_special_tokens);
  } else {
    if (!chat_template_) throw HttpError(400, "this model has no chat template; start the server with --chat-template FILE");
    ids = tokenizer->encode(chat_template_->render(t.messages, t.add_generation_prompt), t.add_special_tokens);
  }
  res.set_content(to_text(json{{"tokens", ids}, {"count", ids.size()}, {"max_model_len", options_.max_context_len}}),
                  "application/json");
}

void HttpServer::detokenize(const httplib::Request& req, httplib::Response& res) {
  const std::vector<int32_t> ids = parse_detokenize_request(req.body);
  const Tokenizer* tokenizer = engine_.tokenizer();
  if (tokenizer == nullptr) throw HttpError(400, "this model has no tokenizer");
  for (int32_t id : ids) {
    if (id >= tokenizer->vocab_size()) {
      throw HttpError(400, fmt::format("token id {} is out of range [0, {})", id, tokenizer->vocab_size()));
    }
  }
  res.set_content(to_text(json{{"prompt", tokenizer->decode(ids, false)}}), "application/json");
}

void HttpServer::completions(const httplib::Request& req, httplib::Response& res) { generate(req, res, false); }

void HttpServer::chat_completions(const httplib::Request& req, httplib::Response& res) { generate(req, res, true); }

void HttpServer::chat_page(const httplib::Request&, httplib::Response& res) {
  res.set_content(std::string(chat_page_html()), "text/html; charset=utf-8");
}

}  // namespace specula::server
