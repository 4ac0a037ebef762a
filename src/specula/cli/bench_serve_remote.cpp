// `specula bench serve --url`: streaming /v1/completions requests timed on the client.
#include "specula/cli/bench_serve_remote.h"

#include <fmt/format.h>
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "specula/core/error.h"

namespace specula {

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

// A request may wait this long for its next byte (a long queue ahead of it, a slow prefill).
constexpr int kReadTimeoutS = 600;
constexpr int kConnectTimeoutS = 5;

// "http://host:port/prefix" -> the client's "http://host:port" and the path prefix ("/prefix").
struct Endpoint {
  std::string base, prefix;
};

Endpoint split_url(std::string url) {
  while (!url.empty() && url.back() == '/') url.pop_back();
  const size_t scheme = url.find("://");
  const size_t path = url.find('/', scheme == std::string::npos ? 0 : scheme + 3);
  if (path == std::string::npos) return {url, ""};
  return {url.substr(0, path), url.substr(path)};
}

std::string describe(httplib::Error e) {
  switch (e) {
    case httplib::Error::Connection: return "could not connect (connection refused, or no such host)";
    case httplib::Error::ConnectionTimeout: return fmt::format("no connection within {} s", kConnectTimeoutS);
    case httplib::Error::Read: return "the connection broke or went silent while reading the reply";
    case httplib::Error::Write: return "the connection broke while sending the request";
    default: return httplib::to_string(e);
  }
}

std::unique_ptr<httplib::Client> make_client(const Endpoint& e) {
  auto client = std::make_unique<httplib::Client>(e.base);
  SPECULA_CHECK(client->is_valid(), "--url {}: not a valid http(s)://host:port address", e.base);
  client->set_keep_alive(true);
  client->set_tcp_nodelay(true);
  client->set_connection_timeout(kConnectTimeoutS, 0);
  client->set_read_timeout(kReadTimeoutS, 0);
  client->set_write_timeout(60, 0);
  return client;
}

// An error reply's message: OpenAI's {"error": {"message": ...}}, or the body's start.
std::string error_message(const std::string& body) {
  try {
    const json j = json::parse(body);
    if (j.contains("error") && j["error"].contains("message")) return j["error"]["message"].get<std::string>();
  } catch (const std::exception&) {
  }
  if (body.empty()) return "(an empty body: is this an OpenAI-compatible server?)";
  return body.substr(0, 200);
}

// Prometheus text -> {"name{labels}": value}.
std::map<std::string, double> parse_metrics(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    if (space == std::string::npos) continue;
    try {
      out[line.substr(0, space)] = std::stod(line.substr(space + 1));
    } catch (const std::exception&) {
    }
  }
  return out;
}

std::map<std::string, double> fetch_metrics(httplib::Client& client, const std::string& prefix) {
  const httplib::Result r = client.Get(prefix + "/metrics");
  if (!r || r->status != 200) return {};
  return parse_metrics(r->body);
}

// Server-Sent Events of one streaming completion, fed as bytes arrive.
class SseReader {
 public:
  explicit SseReader(RemoteRequestResult& out) : out_(out) {}

  void feed(const char* data, size_t n, double t) {
    buffer_.append(data, n);
    size_t end;
    while ((end = buffer_.find("\n\n")) != std::string::npos) {
      const std::string event = buffer_.substr(0, end);
      buffer_.erase(0, end + 2);
      on_event(event, t);
    }
  }
  bool done() const { return done_; }
  const std::string& error() const { return error_; }
  const std::string& finish_reason() const { return finish_reason_; }
  bool has_usage() const { return usage_; }

 private:
  void on_event(const std::string& event, double t) {
    std::string data;
    std::istringstream lines(event);
    std::string line;
    while (std::getline(lines, line)) {
      if (line.starts_with("data:")) data += line.substr(line.size() > 5 && line[5] == ' ' ? 6 : 5);
    }
    if (data.empty() || !error_.empty()) return;
    if (data == "[DONE]") {
      done_ = true;
      out_.latency_s = t;
      return;
    }
    try {
      const json j = json::parse(data);
      if (j.contains("error")) {
        error_ = "error event: " + (j["error"].contains("message") ? j["error"]["message"].get<std::string>() : data);
        return;
      }
      bool text = false;
      for (const json& c : j.value("choices", json::array())) {
        if (c.contains("text") && c["text"].is_string() && !c["text"].get<std::string>().empty()) text = true;
        if (c.contains("finish_reason") && c["finish_reason"].is_string()) finish_reason_ = c["finish_reason"];
      }
      if (text) {
        if (out_.text_chunk_times_s.empty()) out_.ttft_s = t;
        out_.text_chunk_times_s.push_back(t);
      }
      if (j.contains("usage") && j["usage"].is_object()) {
        usage_ = true;
        out_.prompt_tokens = j["usage"].value("prompt_tokens", int64_t{0});
        out_.completion_tokens = j["usage"].value("completion_tokens", int64_t{0});
      }
    } catch (const std::exception& e) {
      error_ = fmt::format("unreadable SSE data ({}): {}", e.what(), data.substr(0, 200));
    }
  }

  RemoteRequestResult& out_;
  std::string buffer_;
  bool done_ = false, usage_ = false;
  std::string error_, finish_reason_;
};

RemoteRequestResult send_one(httplib::Client& client, const Endpoint& endpoint, const std::string& body) {
  RemoteRequestResult out;
  SseReader sse(out);
  int status = 0;
  std::string error_body;
  httplib::Request req;
  req.method = "POST";
  req.path = endpoint.prefix + "/v1/completions";
  req.set_header("Content-Type", "application/json");
  req.set_header("Accept", "text/event-stream");
  req.body = body;
  const auto sent = Clock::now();
  req.response_handler = [&](const httplib::Response& r) {
    status = r.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    const double t = std::chrono::duration<double>(Clock::now() - sent).count();
    if (status != 200) {
      if (error_body.size() < 4096) error_body.append(data, n);
    } else {
      sse.feed(data, n, t);
    }
    return true;
  };
  const httplib::Result r = client.send(req);
  if (!r) {
    out.error = describe(r.error());
  } else if (status != 200) {
    out.error = fmt::format("HTTP {}: {}", status, error_message(error_body));
  } else if (!sse.error().empty()) {
    out.error = sse.error();
  } else if (!sse.done()) {
    out.error = "the stream ended without data: [DONE]";
  } else if (sse.finish_reason() != "length") {
    out.error = fmt::format("finished with '{}', not 'length'", sse.finish_reason());
  } else if (!sse.has_usage()) {
    out.error = "no usage chunk (stream_options.include_usage)";
  } else if (out.text_chunk_times_s.empty()) {
    out.error = "no chunk carried text";
  }
  return out;
}

}  // namespace

RemoteServer probe_server(const std::string& url) {
  const Endpoint endpoint = split_url(url);
  auto client = make_client(endpoint);
  client->set_read_timeout(10, 0);
  const httplib::Result r = client->Get(endpoint.prefix + "/v1/models");
  SPECULA_CHECK(r, "cannot reach {}: {}", url, describe(r.error()));
  SPECULA_CHECK(r->status == 200, "cannot reach {}: GET /v1/models answered HTTP {}: {}", url, r->status,
                error_message(r->body));
  RemoteServer server;
  try {
    const json j = json::parse(r->body);
    const json& model = j.at("data").at(0);
    server.model = model.at("id").get<std::string>();
    server.max_model_len = model.value("max_model_len", int64_t{0});
  } catch (const std::exception& e) {
    throw Error(fmt::format("{}: GET /v1/models did not list a model ({}): {}", url, e.what(), r->body.substr(0, 200)));
  }
  return server;
}

RemoteBenchResult run_remote_bench(const RemoteBenchOptions& o) {
  const Endpoint endpoint = split_url(o.url);
  const size_t n = o.prompts.size();
  SPECULA_CHECK(o.send_at_s.size() == n, "one send time per prompt");
  RemoteBenchResult result;
  result.requests.resize(n);
  std::vector<std::string> bodies(n);
  for (size_t i = 0; i < n; ++i) {
    bodies[i] = json{{"model", o.model},
                     {"prompt", o.prompts[i]},
                     {"max_tokens", o.output_len},
                     {"temperature", 0},
                     {"ignore_eos", true},
                     {"stream", true},
                     {"stream_options", {{"include_usage", true}}}}
                    .dump();
  }
  auto metrics_client = make_client(endpoint);
  result.metrics_before = fetch_metrics(*metrics_client, endpoint.prefix);

  // One thread (and connection) per request in flight: a free thread takes the next request in
  // order and sends it at its arrival time, so at most max_concurrency are in flight and a
  // request that arrives while all are busy goes out when one finishes.
  const size_t threads = o.max_concurrency > 0 ? std::min(n, static_cast<size_t>(o.max_concurrency)) : n;
  std::mutex mu;
  size_t next = 0;
  const auto start = Clock::now();
  std::vector<std::thread> workers;
  for (size_t w = 0; w < threads; ++w) {
    workers.emplace_back([&] {
      auto client = make_client(endpoint);
      for (;;) {
        size_t i;
        {
          std::lock_guard lk(mu);
          if (next == n) return;
          i = next++;
        }
        std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                                  std::chrono::duration<double>(o.send_at_s[i])));
        result.requests[i] = send_one(*client, endpoint, bodies[i]);
      }
    });
  }
  for (std::thread& t : workers) t.join();
  result.duration_s = std::chrono::duration<double>(Clock::now() - start).count();
  result.metrics_after = fetch_metrics(*metrics_client, endpoint.prefix);
  return result;
}

}  // namespace specula
