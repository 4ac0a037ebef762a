// The generation endpoints (/v1/completions, /v1/chat/completions): prompts built and checked
// against the context, one engine request per (prompt, choice), answered whole or streamed as
// Server-Sent Events. A streaming client that goes away cancels its requests at once.
#include <fmt/format.h>
#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <random>

#include "specula/core/error.h"
#include "specula/server/http_server.h"
#include "specula/server/openai_request.h"
#include "specula/server/openai_response.h"

namespace specula::server {

namespace {

// What the engine's stepping thread hands a request's HTTP thread: one chunk of one choice.
struct Event {
  size_t choice = 0;
  std::vector<int32_t> ids;
  std::vector<TokenLogprobs> logprobs;
  std::string text;
  bool finished = false;
  RequestOutput output;  // set when finished
};

class Collector {
 public:
  void push(Event e) {
    {
      std::lock_guard lk(mu_);
      events_.push_back(std::move(e));
    }
    cv_.notify_one();
  }
  std::optional<Event> pop(std::chrono::milliseconds timeout) {
    std::unique_lock lk(mu_);
    if (!cv_.wait_for(lk, timeout, [&] { return !events_.empty(); })) return std::nullopt;
    Event e = std::move(events_.front());
    events_.pop_front();
    return e;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Event> events_;
};

struct Prompt {
  std::vector<int32_t> ids;
  std::string text;  // what echo repeats
};

uint64_t random_seed() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return rng();
}

}  // namespace

// Everything one generation request needs after its handler returns (streams outlive it).
struct HttpServer::Generation {
  GenerationRequest request;
  std::vector<Prompt> prompts;
  std::vector<uint64_t> engine_ids;  // per choice: prompt p, sample j at p * n + j
  std::shared_ptr<Collector> events = std::make_shared<Collector>();
  std::string id;
  int64_t created = 0;
  size_t finished = 0;
  size_t choices() const { return prompts.size() * static_cast<size_t>(request.n); }
  const Prompt& prompt_of(size_t choice) const { return prompts[choice / static_cast<size_t>(request.n)]; }
};

void HttpServer::generate(const httplib::Request& req, httplib::Response& res, bool chat) {
  auto gen = std::make_shared<Generation>();
  gen->request = chat ? parse_chat_request(req.body) : parse_completion_request(req.body);
  GenerationRequest& g = gen->request;
  if (!g.model.empty() && g.model != options_.served_model_name) {
    throw HttpError(404, fmt::format("the model '{}' does not exist; this server serves '{}'", g.model,
                                     options_.served_model_name), "not_found_error");
  }
  if (stopping_) throw HttpError(503, "the server is shutting down", "service_unavailable");
  const Tokenizer* tokenizer = engine_.tokenizer();
  if (tokenizer == nullptr) throw HttpError(400, "this model has no tokenizer; the API needs one");

  if (chat) {
    if (!chat_template_) {
      throw HttpError(400, "this model has no chat template; use /v1/completions or start the server with "
                           "--chat-template FILE");
    }
    Prompt p;
    p.text = chat_template_->render(g.messages, g.add_generation_prompt, g.template_kwargs);
    // The template writes the special tokens itself (transformers' apply_chat_template).
    p.ids = tokenizer->encode(p.text, /*add_special_tokens=*/false);
    gen->prompts.push_back(std::move(p));
  } else if (g.prompt_is_ids) {
    for (auto& ids : g.prompt_ids) gen->prompts.push_back({ids, tokenizer->decode(ids)});
  } else {
    for (auto& text : g.prompt_texts) gen->prompts.push_back({tokenizer->encode(text), text});
  }
  const int context = options_.max_context_len;
  for (const Prompt& p : gen->prompts) {
    const auto len = static_cast<int64_t>(p.ids.size());
    if (len == 0) throw HttpError(400, "the prompt encodes to no tokens");
    if (len >= context) {
      throw HttpError(400, fmt::format("this model's maximum context length is {} tokens; the prompt has {} tokens",
                                       context, len));
    }
    if (g.max_tokens && len + *g.max_tokens > context) {
      throw HttpError(400, fmt::format("this model's maximum context length is {} tokens, but {} tokens were requested "
                                       "({} in the prompt, {} for the completion); reduce the prompt or max_tokens",
                                       context, len + *g.max_tokens, len, *g.max_tokens));
    }
  }

  gen->id = make_id(chat ? "chatcmpl-" : "cmpl-");
  gen->created = static_cast<int64_t>(std::time(nullptr));
  const auto submit_all = [&] {
    for (size_t c = 0; c < gen->choices(); ++c) {
      const Prompt& p = gen->prompt_of(c);
      EngineRequest er;
      er.prompt_ids = p.ids;
      er.max_new_tokens = g.max_tokens.value_or(context - static_cast<int>(p.ids.size()));
      er.sampling = g.sampling;
      er.sampling.seed = g.seeded ? g.sampling.seed + c : random_seed();
      er.ignore_eos = g.ignore_eos;
      er.stop_strings = g.stop;
      er.stop_token_ids = g.stop_token_ids;
      er.logprobs = g.logprobs;
      er.format = g.format;
      std::weak_ptr<Collector> events = gen->events;
      auto handle = engine_.submit(std::move(er), [events, c](const StreamChunk& chunk) {
        const auto sink = events.lock();
        if (!sink) return;
        Event e{c, chunk.token_ids, chunk.logprobs, chunk.text, chunk.finished, {}};
        if (chunk.finished) e.output = *chunk.output;
        sink->push(std::move(e));
      });
      gen->engine_ids.push_back(handle->id());
      track(handle->id());
    }
  };
  try {
    submit_all();
  } catch (const std::exception& e) {
    for (uint64_t id : gen->engine_ids) {
      engine_.cancel(id);
      untrack(id);
    }
    if (dynamic_cast<const EngineBusy*>(&e) != nullptr) throw HttpError(503, e.what(), "service_unavailable");
    throw HttpError(400, e.what());
  }

  if (g.stream) {
    note_.streamed = true;
    const auto start = std::chrono::steady_clock::now();
    const std::string line = fmt::format("{} {}", req.method, req.path);
    const char* endpoint = chat ? "/v1/chat/completions" : "/v1/completions";
    auto completion_tokens = std::make_shared<int64_t>(0);
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, gen, chat, completion_tokens](size_t, httplib::DataSink& sink) {
          // cpp-httplib does not guard content providers: an exception would end the process.
          try {
            return stream(*gen, chat, sink, *completion_tokens);
          } catch (const std::exception& e) {
            log(LogLevel::error, fmt::format("stream {}: {}", gen->id, e.what()));
            return false;
          }
        },
        [this, gen, start, line, endpoint, completion_tokens](bool success) {
          // Whatever did not finish (a client that went away) is cancelled at once.
          for (uint64_t id : gen->engine_ids) {
            engine_.cancel(id);
            untrack(id);
          }
          metrics_.request_done(endpoint, 200);
          const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
          log(LogLevel::info, fmt::format("{} 200 {:.1f} ms {} tokens, streamed{}", line, ms, *completion_tokens,
                                          success ? "" : " (client went away: cancelled)"));
        });
    return;
  }

  // Whole answer: wait for every choice.
  std::vector<RequestOutput> outputs(gen->choices());
  while (gen->finished < gen->choices()) {
    std::optional<Event> e = gen->events->pop(std::chrono::milliseconds(1000));
    if (!e || !e->finished) continue;
    outputs[e->choice] = std::move(e->output);
    untrack(gen->engine_ids[e->choice]);
    ++gen->finished;
  }
  json body = response_head(gen->id, chat ? "chat.completion" : "text_completion", gen->created, options_.served_model_name);
  json choices = json::array();
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  for (size_t c = 0; c < outputs.size(); ++c) {
    const RequestOutput& out = outputs[c];
    if (out.finish_reason.starts_with("error: ")) {
      throw HttpError(500, out.finish_reason.substr(7), "internal_server_error");
    }
    metrics_.generation_done(static_cast<int>(out.prompt_ids.size()), out.cached_tokens,
                             static_cast<int>(out.output_ids.size()), out.time_to_first_token_s, out.token_times_s,
                             out.latency_s);
    completion_tokens += static_cast<int64_t>(out.output_ids.size());
    if (c % static_cast<size_t>(g.n) == 0) {
      prompt_tokens += static_cast<int64_t>(out.prompt_ids.size());
      cached_tokens += out.cached_tokens;
    }
    json choice = {{"index", c}};
    if (chat) {
      choice["message"] = {{"role", "assistant"}, {"content", out.text}};
      choice["logprobs"] = g.logprobs >= 0 ? chat_logprobs(*tokenizer, out.output_ids, out.logprobs) : json(nullptr);
    } else {
      const std::string echo = g.echo ? gen->prompt_of(c).text : std::string();
      choice["text"] = echo + out.text;
      choice["logprobs"] = g.logprobs >= 0 ? completion_logprobs(*tokenizer, out.output_ids, out.logprobs, echo.size())
                                           : json(nullptr);
    }
    choice["finish_reason"] = finish_reason(out.finish_reason);
    choices.push_back(std::move(choice));
  }
  body["choices"] = std::move(choices);
  body["usage"] = usage_json(prompt_tokens, completion_tokens, cached_tokens);
  note_.completion_tokens = static_cast<int>(completion_tokens);
  res.set_content(to_text(body), "application/json");
}

bool HttpServer::stream(Generation& gen, bool chat, httplib::DataSink& sink, int64_t& completion_tokens) {
  const GenerationRequest& g = gen.request;
  const Tokenizer& tokenizer = *engine_.tokenizer();
  const char* object = chat ? "chat.completion.chunk" : "text_completion";
  const auto chunk = [&](json choice) {
    json j = response_head(gen.id, object, gen.created, options_.served_model_name);
    j["choices"] = json::array({std::move(choice)});
    if (g.include_usage) j["usage"] = nullptr;
    return sse_event(j);
  };
  const auto write = [&](const std::string& data) { return sink.write(data.data(), data.size()); };
  std::vector<size_t> text_offset(gen.choices(), 0);
  // The first chunk of every choice: the assistant role (chat) or the echoed prompt.
  for (size_t c = 0; c < gen.choices(); ++c) {
    if (chat) {
      if (!write(chunk({{"index", c}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr},
                        {"finish_reason", nullptr}}))) {
        return false;
      }
    } else if (g.echo) {
      const std::string& text = gen.prompt_of(c).text;
      text_offset[c] = text.size();
      if (!write(chunk({{"index", c}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", nullptr}}))) return false;
    }
  }
  int64_t prompt_tokens = 0, cached_tokens = 0;
  while (gen.finished < gen.choices()) {
    std::optional<Event> e = gen.events->pop(std::chrono::milliseconds(100));
    if (!e) {
      if (!sink.is_writable()) return false;  // the client went away while nothing was produced
      continue;
    }
    const size_t c = e->choice;
    completion_tokens += static_cast<int64_t>(e->ids.size());
    if (!e->text.empty() || (g.logprobs >= 0 && !e->ids.empty())) {
      json choice = {{"index", c}};
      json logprobs = nullptr;
      if (chat) {
        choice["delta"] = {{"content", e->text}};
        if (g.logprobs >= 0) logprobs = chat_logprobs(tokenizer, e->ids, e->logprobs);
      } else {
        choice["text"] = e->text;
        if (g.logprobs >= 0) logprobs = completion_logprobs(tokenizer, e->ids, e->logprobs, text_offset[c]);
      }
      text_offset[c] += e->text.size();
      choice["logprobs"] = std::move(logprobs);
      choice["finish_reason"] = nullptr;
      if (!write(chunk(std::move(choice)))) return false;
    }
    if (!e->finished) continue;
    const RequestOutput& out = e->output;
    ++gen.finished;
    untrack(gen.engine_ids[c]);
    if (out.finish_reason.starts_with("error: ")) {
      if (!write(sse_event(error_json(500, out.finish_reason.substr(7), "internal_server_error")))) return false;
      continue;
    }
    metrics_.generation_done(static_cast<int>(out.prompt_ids.size()), out.cached_tokens,
                             static_cast<int>(out.output_ids.size()), out.time_to_first_token_s, out.token_times_s,
                             out.latency_s);
    if (c % static_cast<size_t>(g.n) == 0) {
      prompt_tokens += static_cast<int64_t>(out.prompt_ids.size());
      cached_tokens += out.cached_tokens;
    }
    json choice = {{"index", c}};
    if (chat) choice["delta"] = json::object();
    else choice["text"] = "";
    choice["logprobs"] = nullptr;
    choice["finish_reason"] = finish_reason(out.finish_reason);
    if (!write(chunk(std::move(choice)))) return false;
  }
  if (g.include_usage) {
    json j = response_head(gen.id, object, gen.created, options_.served_model_name);
    j["choices"] = json::array();
    j["usage"] = usage_json(prompt_tokens, completion_tokens, cached_tokens);
    if (!write(sse_event(j))) return false;
  }
  if (!write(sse_done())) return false;
  sink.done();
  return true;
}

}  // namespace specula::server
