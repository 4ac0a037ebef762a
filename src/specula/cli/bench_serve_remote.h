// `specula bench serve --url`: the HTTP client side of the serving benchmark. The prompts (token
// ids) go to a running server's POST /v1/completions as streaming requests from client threads
// (one keep-alive httplib::Client each), at given send times and at most max_concurrency in
// flight; every request is timed on the client. Built only with cpp-httplib (SPECULA_HAS_SERVER).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace specula {

// What GET /v1/models says (it also proves the server is up).
struct RemoteServer {
  std::string model;         // the served model name, sent with every request
  int64_t max_model_len = 0;  // 0: not given
};

// Throws specula::Error "cannot reach URL: ..." when the server does not answer /v1/models.
RemoteServer probe_server(const std::string& url);

struct RemoteRequestResult {
  std::string error;  // empty: the request completed (finish reason "length", usage given)
  double ttft_s = 0;     // send to the first SSE chunk with non-empty text
  double latency_s = 0;  // send to the end of the stream
  std::vector<double> text_chunk_times_s;  // from send, one per SSE chunk that carries text
  int64_t prompt_tokens = 0, completion_tokens = 0;  // the final usage chunk's
};

struct RemoteBenchResult {
  double duration_s = 0;  // first send to the last request's end
  std::vector<RemoteRequestResult> requests;  // in prompt order
  // GET /metrics before and after the run (Prometheus samples by name with labels); empty when
  // the server did not answer it.
  std::map<std::string, double> metrics_before, metrics_after;
};

struct RemoteBenchOptions {
  std::string url;
  std::string model;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<double> send_at_s;  // per prompt, seconds after the start (the arrival process)
  int output_len = 0;
  int max_concurrency = 0;  // 0: unlimited
};

RemoteBenchResult run_remote_bench(const RemoteBenchOptions& options);

}  // namespace specula
