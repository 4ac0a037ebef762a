// specula::jinja::Template: a Hugging Face chat template (the Jinja2 subset transformers'
// apply_chat_template uses), parsed once and rendered per request with the same bytes
// transformers would produce. See README.md in this folder for the supported subset.
//
//   auto t = jinja::Template::parse(tokenizer_config["chat_template"].get<std::string>());
//   std::string prompt = t.render({{"messages", messages}, {"add_generation_prompt", true},
//                                  {"bos_token", "<s>"}, {"eos_token", "</s>"}});
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <ctime>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "specula/core/error.h"

namespace specula::jinja {

struct Program;

struct RenderOptions {
  // The clock behind strftime_now(format): local time, as transformers' datetime.now(). Tests
  // inject a fixed date.
  std::function<std::tm()> now;
  // Bounds that keep hostile templates from exhausting memory, stack or time; each failure is
  // a specula::Error saying which bound was hit.
  size_t max_output_bytes = size_t{16} << 20;  // the rendered text, and any one string or capture
  int max_depth = 256;                         // nested evaluations (expressions, blocks, macro calls)
  uint64_t max_steps = 10'000'000;             // evaluated nodes, loop iterations, copied elements
};

// Raised by the template's own raise_exception(message) (e.g. "Conversation roles must
// alternate ..."); what() adds the location, template_message() is the template's text alone,
// the part to show an API client.
class TemplateException : public Error {
 public:
  TemplateException(const std::string& what, std::string template_message)
      : Error(what), template_message_(std::move(template_message)) {}
  const std::string& template_message() const { return template_message_; }

 private:
  std::string template_message_;
};

// Parse once, render many times: render() is const and may run concurrently on one Template.
class Template {
 public:
  // Throws specula::Error "template line L, column C: ..." on a syntax error or an unsupported
  // statement.
  static Template parse(std::string_view source);

  // `context` must be an object (null counts as empty); its keys become template variables (messages, tools,
  // add_generation_prompt, bos_token, ...) with key order kept, as Python dicts keep it.
  // Throws TemplateException for raise_exception() and specula::Error for anything else.
  std::string render(const nlohmann::ordered_json& context, const RenderOptions& options = {}) const;

 private:
  explicit Template(std::shared_ptr<const Program> program) : program_(std::move(program)) {}
  std::shared_ptr<const Program> program_;
};

}  // namespace specula::jinja
