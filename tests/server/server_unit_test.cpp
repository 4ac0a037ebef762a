// The server's pure parts: request parsing and validation, SSE framing, the Prometheus text of
// the metrics, and the shipped model's chat template.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>

#include "specula/server/chat_template.h"
#include "specula/server/metrics.h"
#include "specula/server/openai_request.h"
#include "specula/server/openai_response.h"

namespace specula::server {
namespace {

std::string error_400(const std::string& body, bool chat = false) {
  try {
    chat ? parse_chat_request(body) : parse_completion_request(body);
  } catch (const HttpError& e) {
    EXPECT_EQ(e.status, 400) << body;
    return e.what();
  }
  return "(accepted)";
}

TEST(OpenAIRequest, CompletionFieldsAndDefaults) {
  const GenerationRequest g = parse_completion_request(
      R"({"model": "m", "prompt": ["a", "b"], "max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": -1,
          "min_p": 0.05, "n": 3, "stop": "x", "seed": 42, "presence_penalty": 0.5, "frequency_penalty": -0.25,
          "repetition_penalty": 1.1, "logprobs": 2, "echo": true, "ignore_eos": true, "stream": true,
          "stream_options": {"include_usage": true}, "user": "ignored", "unknown_field": {"x": 1}})");
  EXPECT_EQ(g.model, "m");
  EXPECT_EQ(g.prompt_texts, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(g.max_tokens, 7);
  EXPECT_FLOAT_EQ(g.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(g.sampling.top_p, 0.9f);
  EXPECT_EQ(g.sampling.top_k, 0);
  EXPECT_FLOAT_EQ(g.sampling.min_p, 0.05f);
  EXPECT_EQ(g.n, 3);
  EXPECT_EQ(g.stop, (std::vector<std::string>{"x"}));
  EXPECT_TRUE(g.seeded);
  EXPECT_EQ(g.sampling.seed, 42u);
  EXPECT_FLOAT_EQ(g.sampling.frequency_penalty, -0.25f);
  EXPECT_FLOAT_EQ(g.sampling.repetition_penalty, 1.1f);
  EXPECT_EQ(g.logprobs, 2);
  EXPECT_TRUE(g.echo && g.ignore_eos && g.stream && g.include_usage);
  const GenerationRequest d = parse_completion_request(R"({"prompt": [[1, 2], [3]]})");
  EXPECT_TRUE(d.prompt_is_ids);
  EXPECT_EQ(d.prompt_ids, (std::vector<std::vector<int32_t>>{{1, 2}, {3}}));
  EXPECT_EQ(d.max_tokens, 16);  // OpenAI's default for completions
  EXPECT_FLOAT_EQ(d.sampling.temperature, 1.0f);
  EXPECT_EQ(d.logprobs, -1);
  EXPECT_FALSE(d.seeded);
}

TEST(OpenAIRequest, ChatMessagesPartsAndKwargs) {
  const GenerationRequest g = parse_chat_request(
      R"({"messages": [{"role": "system", "content": "s"},
                        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                        {"role": "assistant", "content": null, "tool_calls": [{"id": "t", "zeta": 1, "alpha": 2}]}],
          "max_completion_tokens": 5, "max_tokens": 9, "logprobs": true, "top_logprobs": 4,
          "chat_template_kwargs": {"enable_thinking": false}, "tools": [{"type": "function"}]})");
  ASSERT_EQ(g.messages.size(), 3u);
  EXPECT_EQ(g.messages[1]["content"], "a\nb");
  EXPECT_EQ(g.messages[2]["content"], "");
  // Client key order survives (templates render tool calls with tojson).
  EXPECT_EQ(g.messages[2]["tool_calls"].dump(), R"([{"id":"t","zeta":1,"alpha":2}])");
  EXPECT_EQ(g.max_tokens, 5);
  EXPECT_EQ(g.logprobs, 4);
  EXPECT_EQ(g.template_kwargs["enable_thinking"], false);
  EXPECT_EQ(g.template_kwargs["tools"][0]["type"], "function");
  EXPECT_FALSE(parse_chat_request(R"({"messages": [{"role": "user", "content": "x"}]})").max_tokens.has_value());
}

TEST(OpenAIRequest, BadFieldsNameTheFieldAndValue) {
  EXPECT_NE(error_400(R"({"prompt": "a", "temperature": -1})").find("'temperature' = -1 is out of range"), std::string::npos);
  EXPECT_NE(error_400(R"({"prompt": "a", "n": 65})").find("'n' = 65 is out of range [1, 64]"), std::string::npos);
  EXPECT_NE(error_400(R"({"prompt": [1, -1]})").find("'prompt[1]' = -1 is out of range"), std::string::npos);
  EXPECT_NE(error_400(R"({"prompt": "a", "stop": ["a", 3]})").find("'stop[1]' must be a string"), std::string::npos);
  EXPECT_NE(error_400(R"({"prompt": "a", "stop": ["", "b"]})").find("empty string"), std::string::npos);
  EXPECT_NE(error_400(R"({"prompt": "a", "max_tokens": 1.5})").find("'max_tokens' must be an integer"), std::string::npos);
  EXPECT_NE(error_400(R"({"prompt": "a")").find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_400(R"({"messages": [{"role": "user"}]})", true).find("'messages[0].content' is missing"), std::string::npos);
  EXPECT_NE(error_400(R"({"messages": "hi"})", true).find("'messages' must be an array"), std::string::npos);
  EXPECT_NE(error_400(R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 21, "logprobs": true})", true)
                .find("'top_logprobs' = 21 is out of range [0, 20]"),
            std::string::npos);
}

TEST(OpenAIResponse, SseFramingAndErrors) {
  EXPECT_EQ(sse_event(json{{"a", 1}, {"b", "x\ny"}}), "data: {\"a\":1,\"b\":\"x\\ny\"}\n\n");
  EXPECT_EQ(sse_done(), "data: [DONE]\n\n");
  // Invalid UTF-8 (a partial byte token) is replaced, never thrown.
  EXPECT_EQ(sse_event(json{{"t", std::string("\xe2\x82")}}), "data: {\"t\":\"\xef\xbf\xbd\"}\n\n");
  const json e = error_json(404, "no such model", "not_found_error");
  EXPECT_EQ(e.dump(), R"({"error":{"message":"no such model","type":"not_found_error","param":null,"code":404}})");
  EXPECT_EQ(finish_reason("cancelled"), "abort");
  EXPECT_EQ(finish_reason("length"), "length");
  EXPECT_EQ(usage_json(3, 4, 1).dump(),
            R"({"prompt_tokens":3,"completion_tokens":4,"total_tokens":7,"prompt_tokens_details":{"cached_tokens":1}})");
  EXPECT_NE(make_id("cmpl-"), make_id("cmpl-"));
}

TEST(Metrics, HistogramsAreCumulativeAndCountersAdd) {
  Metrics m;
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<double> seconds(0.0005, 3.0);
  std::vector<double> ttfts;
  double sum = 0;
  for (int i = 0; i < 50; ++i) {
    const double t = seconds(rng);
    ttfts.push_back(t);
    sum += t;
    m.generation_done(10, 4, 3, t, {t, t + 0.01, t + 0.03}, t + 0.03);
    m.request_done("/v1/completions", i % 5 == 0 ? 400 : 200);
  }
  SchedulerStats s;
  s.running = 2;
  s.waiting = 1;
  s.kv_total_tokens = 1000;
  s.kv_free_tokens = 600;
  s.kv_cached_tokens = 150;
  s.prompt_tokens = 200;
  s.cached_tokens = 50;
  s.prefill_only_steps = 7;
  s.prefill_only_s = 0.375;
  s.admission_deferred_steps = 11;
  const std::string text = m.render(s, "my \"model\"");
  const auto value = [&](const std::string& series) {
    const size_t at = text.find("\n" + series + " ");
    EXPECT_NE(at, std::string::npos) << series << "\n" << text;
    return std::stod(text.substr(at + series.size() + 2));
  };
  EXPECT_EQ(value("specula_requests_total{endpoint=\"/v1/completions\",status=\"200\"}"), 40);
  EXPECT_EQ(value("specula_requests_total{endpoint=\"/v1/completions\",status=\"400\"}"), 10);
  EXPECT_EQ(value("specula_prompt_tokens_total"), 500);
  EXPECT_EQ(value("specula_generation_tokens_total"), 150);
  EXPECT_EQ(value("specula_kv_cache_usage_ratio"), 0.25);
  EXPECT_EQ(value("specula_prefix_cache_hit_rate"), 0.25);
  EXPECT_EQ(value("specula_num_requests_running"), 2);
  EXPECT_EQ(value("specula_prefill_only_steps_total"), 7);
  EXPECT_EQ(value("specula_prefill_only_seconds_total"), 0.375);
  EXPECT_EQ(value("specula_admission_deferred_steps_total"), 11);
  const auto below = [&](double bound) { return std::count_if(ttfts.begin(), ttfts.end(), [&](double t) { return t <= bound; }); };
  EXPECT_EQ(value("specula_time_to_first_token_seconds_bucket{le=\"0.1\"}"), below(0.1));
  EXPECT_EQ(value("specula_time_to_first_token_seconds_bucket{le=\"1\"}"), below(1.0));
  EXPECT_EQ(value("specula_time_to_first_token_seconds_bucket{le=\"+Inf\"}"), 50);
  EXPECT_NEAR(value("specula_time_to_first_token_seconds_sum"), sum, 1e-6 * sum);
  EXPECT_EQ(value("specula_inter_token_latency_seconds_count"), 100);
  EXPECT_NE(text.find("specula_model_info{model=\"my \\\"model\\\"\"} 1"), std::string::npos);
}

TEST(ChatTemplate, ShippedModelTemplateAndOverrides) {
  const auto dir = std::filesystem::path(SPECULA_SOURCE_DIR) / "models/specula-byte-6m";
  const auto t = ChatTemplate::load(dir);
  ASSERT_TRUE(t.has_value());
  const nlohmann::ordered_json messages = {{{"role", "system"}, {"content", "Be brief."}},
                                           {{"role", "user"}, {"content", "Hi"}}};
  EXPECT_EQ(t->render(messages, true), "<s>system: Be brief.\nuser: Hi\nassistant:");
  EXPECT_EQ(t->render(messages, false), "<s>system: Be brief.\nuser: Hi\n");
  const auto file = std::filesystem::temp_directory_path() / ("specula_tmpl_" + std::to_string(std::random_device{}()));
  std::ofstream(file) << "{% if messages|length > 1 %}{{ raise_exception('one message only') }}{% endif %}[{{ messages[0].content }}]";
  const auto custom = ChatTemplate::load(dir, file);
  EXPECT_EQ(custom->render({{{"role", "user"}, {"content", "x"}}}, true), "[x]");
  try {
    custom->render(messages, true);
    ADD_FAILURE() << "the template's raise_exception was not raised";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the chat template refused the messages: one message only"), std::string::npos);
  }
  std::filesystem::remove(file);
  EXPECT_FALSE(ChatTemplate::load(std::filesystem::temp_directory_path()).has_value());
}

}  // namespace
}  // namespace specula::server
