// Chat templates: a model's Jinja chat_template (Hugging Face keeps it in tokenizer_config.json,
// as a string or a list of named templates, or in chat_template.jinja) rendered over OpenAI-style
// messages exactly as transformers' apply_chat_template renders it.
#pragma once

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace specula {

namespace jinja {
class Template;
}

class ChatTemplate {
 public:
  // From `override_file` when given, else the folder's chat_template.jinja, else tokenizer_config.json's
  // chat_template ("default" of a named list); nullopt when the model has none. bos_token and
  // eos_token come from tokenizer_config.json. Throws specula::Error for a template that does not
  // parse, naming the file.
  static std::optional<ChatTemplate> load(const std::filesystem::path& model_dir,
                                          const std::filesystem::path& override_file = {});
  ChatTemplate(const std::string& source, std::string bos_token, std::string eos_token, std::string origin);
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // messages: [{role, content}, ...] (content a string); extra: further template variables
  // (tools, ...). Throws specula::Error with the template's own message when it raises.
  std::string render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                     const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;
  const std::string& origin() const { return origin_; }

 private:
  std::unique_ptr<jinja::Template> template_;
  std::string bos_token_, eos_token_, origin_;
};

}  // namespace specula
