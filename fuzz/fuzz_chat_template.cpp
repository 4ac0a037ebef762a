// Fuzzes the Jinja chat-template interpreter (src/specula/jinja/): arbitrary bytes are parsed as
// a template and, when they parse, rendered over a fixed conversation with tools, as the server
// renders a model's chat_template. A specula::Error (syntax errors, raise_exception, the
// interpreter's depth / step / output bounds) is the expected answer; anything else is a finding.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_common.h"
#include "specula/jinja/template.h"

namespace {

const nlohmann::ordered_json& context() {
  static const nlohmann::ordered_json c = nlohmann::ordered_json::parse(R"({
    "messages": [{"role": "system", "content": "Be brief."},
                 {"role": "user", "content": "Héllo 日本 \n\t"},
                 {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function":
                   {"name": "f", "arguments": {"x": 1, "y": [true, null, 2.5]}}}]},
                 {"role": "tool", "content": "{\"ok\": 1}"},
                 {"role": "user", "content": "again"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})");
  return c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string source(reinterpret_cast<const char*>(data), size);
  specula::fuzz::guarded([&] {
    const specula::jinja::Template t = specula::jinja::Template::parse(source);
    specula::jinja::RenderOptions options;
    options.now = [] { return std::tm{0, 0, 12, 14, 2, 125, 5, 72, 0, 0, nullptr}; };
    // Small bounds keep each input fast; the bounds themselves are what is being checked.
    options.max_output_bytes = size_t{1} << 20;
    options.max_steps = 200'000;
    volatile size_t sink = t.render(context(), options).size();
    (void)sink;
  });
  return 0;
}
