// OpenAI request parsing: every field read through JsonReader (presence, type, range), every
// failure an HttpError 400 whose message names the field and the value.
#include "specula/server/openai_request.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "specula/core/error.h"
#include "specula/core/json_reader.h"
#include "specula/runtime/request.h"

namespace specula::server {

namespace {

using json = nlohmann::json;
constexpr const char* kBody = "request";

// Parses the body as a JSON object (errors are specula::Error, turned into 400 by the caller).
json parse_object(const std::string& body) {
  json j = JsonReader::parse(body, kBody);
  SPECULA_CHECK(j.is_object(), "the request body must be a JSON object");
  return j;
}

float bounded_float(const JsonReader& r, const char* key, double fallback, double min, double max) {
  const double v = r.number_or(key, fallback);
  SPECULA_CHECK(v >= min && v <= max, "'{}' = {} is out of range [{}, {}]", key, v, min, max);
  return static_cast<float>(v);
}

std::vector<int32_t> token_ids(const JsonReader& array) {
  std::vector<int32_t> ids;
  array.for_each([&](const JsonReader& id) { ids.push_back(static_cast<int32_t>(id.integer(0, INT32_MAX))); });
  return ids;
}

// The fields both endpoints share.
void parse_common(const JsonReader& r, GenerationRequest& g) {
  g.model = r.string_or("model", "");
  g.n = static_cast<int>(r.int_or("n", 1, 1, kMaxChoices));
  SamplingParams& s = g.sampling;
  s.temperature = bounded_float(r, "temperature", 1.0, 0.0, 100.0);
  s.top_p = bounded_float(r, "top_p", 1.0, 0.0, 1.0);
  SPECULA_CHECK(s.top_p > 0.0f, "'top_p' = 0 is out of range (0, 1]");
  // SGLang's and vLLM's "no limit" is -1; specula's is 0.
  const int64_t top_k = r.int_or("top_k", -1, -1, INT32_MAX);
  s.top_k = top_k <= 0 ? 0 : static_cast<int>(top_k);
  s.min_p = bounded_float(r, "min_p", 0.0, 0.0, 1.0);
  s.presence_penalty = bounded_float(r, "presence_penalty", 0.0, -2.0, 2.0);
  s.frequency_penalty = bounded_float(r, "frequency_penalty", 0.0, -2.0, 2.0);
  s.repetition_penalty = bounded_float(r, "repetition_penalty", 1.0, 0.01, 100.0);
  if (r.has("seed")) {
    s.seed = static_cast<uint64_t>(r.at("seed").integer(INT64_MIN, INT64_MAX));
    g.seeded = true;
  }
  if (const auto stop = r.find("stop")) {
    if (stop->is_string()) {
      g.stop.push_back(stop->string());
    } else {
      if (!stop->is_array()) stop->fail("must be a string or an array of strings");
      SPECULA_CHECK(stop->size() <= static_cast<size_t>(kMaxStopStrings), "'stop' has {} strings; at most {} are allowed",
                    stop->size(), kMaxStopStrings);
      stop->for_each([&](const JsonReader& x) { g.stop.push_back(x.string()); });
    }
    for (const std::string& x : g.stop) SPECULA_CHECK(!x.empty(), "'stop' holds an empty string");
  }
  if (const auto ids = r.find("stop_token_ids")) g.stop_token_ids = token_ids(*ids);
  g.ignore_eos = r.bool_or("ignore_eos", false);
  g.stream = r.bool_or("stream", false);
  if (const auto options = r.find("stream_options")) {
    SPECULA_CHECK(g.stream, "'stream_options' is only allowed when 'stream' is true");
    if (!options->is_object()) options->fail("must be an object");
    g.include_usage = options->bool_or("include_usage", false);
  }
}

// The output format: OpenAI's response_format (text, json_object, json_schema), SGLang's regex,
// ebnf and json_schema (a string) and vLLM's guided_json, guided_regex and guided_grammar; at
// most one of them. Compiled here, so that a bad schema, grammar or pattern is a 400 before any
// decoding. body: the request again, parsed keeping key order (a schema's properties are
// generated in the order written).
grammar::OutputFormat parse_format(const JsonReader& r, const std::string& body) {
  using Kind = grammar::OutputFormat::Kind;
  std::vector<std::string> given;
  grammar::OutputFormat f;
  std::optional<nlohmann::ordered_json> ordered;
  const auto schema_text = [&](const std::vector<std::string>& path) {
    if (!ordered) ordered = nlohmann::ordered_json::parse(body);
    const nlohmann::ordered_json* node = &*ordered;
    for (const std::string& k : path) node = &node->at(k);
    return node->is_string() ? node->get<std::string>() : node->dump();
  };
  const auto set = [&](const std::string& key, Kind kind, std::string source) {
    given.push_back(key);
    f.kind = kind;
    f.source = std::move(source);
  };
  if (const auto rf = r.find("response_format")) {
    if (!rf->is_object()) rf->fail("must be an object");
    const std::string type = rf->at("type").string();
    if (type == "json_object") {
      set("response_format", Kind::kJsonObject, "");
    } else if (type == "json_schema") {
      const JsonReader js = rf->at("json_schema");
      if (!js.is_object()) js.fail("must be an object with 'schema'");
      const JsonReader schema = js.at("schema");
      if (!schema.is_object() && !schema.raw().is_boolean()) schema.fail("must be a JSON Schema (an object)");
      set("response_format", Kind::kJsonSchema, schema_text({"response_format", "json_schema", "schema"}));
    } else if (type != "text") {
      rf->at("type").fail(fmt::format("= '{}' is not valid; supported: text, json_object, json_schema", type));
    }
  }
  for (const char* key : {"json_schema", "guided_json"}) {
    if (const auto v = r.find(key)) {
      if (!v->is_string() && !v->is_object()) v->fail("must be a JSON Schema (an object, or its JSON text)");
      set(key, Kind::kJsonSchema, schema_text({key}));
    }
  }
  for (const char* key : {"regex", "guided_regex"}) {
    if (r.has(key)) set(key, Kind::kRegex, r.at(key).string());
  }
  for (const char* key : {"ebnf", "guided_grammar"}) {
    if (r.has(key)) set(key, Kind::kGrammar, r.at(key).string());
  }
  // Other engines' constraint fields this server does not implement: refused rather than
  // silently generating unconstrained text.
  for (const char* key : {"guided_choice", "guided_whitespace_pattern", "structural_tag"}) {
    if (r.has(key)) {
      throw HttpError(400, fmt::format("'{}' is not supported; supported: response_format, regex, ebnf, json_schema, "
                                       "guided_json, guided_regex, guided_grammar",
                                       key));
    }
  }
  SPECULA_CHECK(given.size() <= 1, "'{}' and '{}' both constrain the output; give one", given.size() > 1 ? given[0] : "",
                given.size() > 1 ? given[1] : "");
  grammar::compile(f);
  return f;
}

std::optional<int> max_tokens(const JsonReader& r, const char* key) {
  if (!r.has(key)) return std::nullopt;
  return static_cast<int>(r.at(key).integer(0, INT32_MAX));
}

// Chat content: a string, null, or an array of text parts (joined with "\n", as vLLM does for
// templates that take strings).
std::string message_content(const JsonReader& content) {
  if (content.is_null()) return {};
  if (content.is_string()) return content.string();
  if (!content.is_array()) content.fail("must be a string or an array of content parts");
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const JsonReader part = content[i];
    const std::string type = part.at("type").string();
    if (type != "text") {
      throw HttpError(400, fmt::format("content part type '{}' is not supported; supported: text", type));
    }
    if (i > 0) text += "\n";
    text += part.at("text").string();
  }
  return text;
}

nlohmann::ordered_json parse_messages(const JsonReader& messages, const nlohmann::ordered_json& ordered) {
  if (!messages.is_array()) messages.fail("must be an array of messages");
  SPECULA_CHECK(messages.size() > 0, "'messages' is empty; give at least one message");
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const JsonReader m = messages[i];
    if (!m.is_object()) m.fail("must be an object with 'role' and 'content'");
    const std::string role = m.at("role").string();
    static const char* kRoles[] = {"system", "developer", "user", "assistant", "tool"};
    SPECULA_CHECK(std::find(std::begin(kRoles), std::end(kRoles), role) != std::end(kRoles),
                  "'messages[{}].role' = '{}' is not valid; valid: system, developer, user, assistant, tool", i, role);
    nlohmann::ordered_json message = {{"role", role}};
    if (!m.raw().contains("content")) SPECULA_CHECK(role == "assistant", "'messages[{}].content' is missing", i);
    message["content"] = m.raw().contains("content") ? message_content(m.at("content")) : std::string();
    // Fields templates read (tool calls and their results) pass through in the client's order.
    const nlohmann::ordered_json& original = ordered.at(i);
    for (const char* key : {"name", "tool_calls", "tool_call_id", "reasoning_content"}) {
      if (original.contains(key)) message[key] = original.at(key);
    }
    out.push_back(std::move(message));
  }
  return out;
}

template <typename Parse>
auto with_400(const Parse& parse) {
  try {
    return parse();
  } catch (const Error& e) {
    throw HttpError(400, e.what());
  }
}

}  // namespace

GenerationRequest parse_completion_request(const std::string& body) {
  return with_400([&] {
    const json j = parse_object(body);
    const JsonReader r(j, kBody);
    GenerationRequest g;
    parse_common(r, g);
    g.format = parse_format(r, body);
    const JsonReader prompt = r.at("prompt");
    if (prompt.is_string()) {
      g.prompt_texts.push_back(prompt.string());
    } else {
      if (!prompt.is_array()) prompt.fail("must be a string, an array of strings, or token ids");
      SPECULA_CHECK(prompt.size() > 0, "'prompt' is empty");
      SPECULA_CHECK(prompt.size() <= static_cast<size_t>(kMaxPrompts) || prompt[0].raw().is_number(),
                    "'prompt' has {} prompts; at most {} are allowed", prompt.size(), kMaxPrompts);
      if (prompt[0].raw().is_number()) {
        g.prompt_is_ids = true;
        g.prompt_ids.push_back(token_ids(prompt));
      } else if (prompt[0].is_array()) {
        g.prompt_is_ids = true;
        prompt.for_each([&](const JsonReader& p) { g.prompt_ids.push_back(token_ids(p)); });
      } else {
        prompt.for_each([&](const JsonReader& p) { g.prompt_texts.push_back(p.string()); });
      }
    }
    for (const auto& ids : g.prompt_ids) SPECULA_CHECK(!ids.empty(), "'prompt' holds an empty list of token ids");
    for (const auto& text : g.prompt_texts) SPECULA_CHECK(!text.empty(), "'prompt' is an empty string");
    // OpenAI's default for legacy completions is 16 tokens.
    g.max_tokens = max_tokens(r, "max_tokens").value_or(16);
    g.echo = r.bool_or("echo", false);
    if (r.has("logprobs")) g.logprobs = static_cast<int>(r.at("logprobs").integer(0, kMaxTopLogprobs));
    return g;
  });
}

GenerationRequest parse_chat_request(const std::string& body) {
  return with_400([&] {
    const json j = parse_object(body);
    const JsonReader r(j, kBody);
    GenerationRequest g;
    g.chat = true;
    parse_common(r, g);
    g.format = parse_format(r, body);
    const JsonReader messages = r.at("messages");
    const auto ordered = nlohmann::ordered_json::parse(body);
    g.messages = parse_messages(messages, ordered.at("messages"));
    g.max_tokens = max_tokens(r, "max_completion_tokens");
    if (!g.max_tokens) g.max_tokens = max_tokens(r, "max_tokens");
    if (r.bool_or("logprobs", false)) {
      g.logprobs = static_cast<int>(r.int_or("top_logprobs", 0, 0, kMaxTopLogprobs));
    } else {
      SPECULA_CHECK(!r.has("top_logprobs"), "'top_logprobs' needs 'logprobs': true");
    }
    g.add_generation_prompt = r.bool_or("add_generation_prompt", true);
    if (const auto kwargs = r.find("chat_template_kwargs")) {
      if (!kwargs->is_object()) kwargs->fail("must be an object");
      g.template_kwargs = ordered.at("chat_template_kwargs");
    }
    if (r.has("tools")) g.template_kwargs["tools"] = ordered.at("tools");
    return g;
  });
}

TokenizeRequest parse_tokenize_request(const std::string& body) {
  return with_400([&] {
    const json j = parse_object(body);
    const JsonReader r(j, kBody);
    TokenizeRequest t;
    if (r.has("prompt")) {
      t.prompt = r.at("prompt").string();
    } else {
      const JsonReader messages = r.at("messages");
      const auto ordered = nlohmann::ordered_json::parse(body);
      t.messages = parse_messages(messages, ordered.at("messages"));
      t.add_generation_prompt = r.bool_or("add_generation_prompt", true);
    }
    t.add_special_tokens = r.bool_or("add_special_tokens", t.prompt.has_value());
    return t;
  });
}

std::vector<int32_t> parse_detokenize_request(const std::string& body) {
  return with_400([&] {
    const json j = parse_object(body);
    return token_ids(JsonReader(j, kBody).at("tokens"));
  });
}

}  // namespace specula::server
