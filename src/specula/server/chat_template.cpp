// Chat template loading and rendering.
#include "specula/server/chat_template.h"

#include "specula/core/error.h"
#include "specula/core/json_reader.h"
#include "specula/jinja/template.h"

namespace specula {

namespace {

// bos_token / eos_token are strings or AddedToken objects ({"content": ...}); null means none.
std::string special_token(const JsonReader& config, const char* key) {
  const auto token = config.find(key);
  if (!token) return {};
  return token->is_string() ? token->string() : token->at("content").string();
}

}  // namespace

std::optional<ChatTemplate> ChatTemplate::load(const std::filesystem::path& model_dir,
                                               const std::filesystem::path& override_file) {
  std::string bos, eos, source, origin;
  const auto config_path = model_dir / "tokenizer_config.json";
  nlohmann::json config_doc = nlohmann::json::object();
  if (!model_dir.empty() && std::filesystem::exists(config_path)) {
    config_doc = JsonReader::parse_file(config_path, "tokenizer_config.json");
  }
  const JsonReader config(config_doc, "tokenizer_config.json");
  if (config.is_object()) {
    bos = special_token(config, "bos_token");
    eos = special_token(config, "eos_token");
  }
  if (!override_file.empty()) {
    source = read_text_file(override_file);
    origin = override_file.string();
  } else if (!model_dir.empty() && std::filesystem::exists(model_dir / "chat_template.jinja")) {
    source = read_text_file(model_dir / "chat_template.jinja");
    origin = (model_dir / "chat_template.jinja").string();
  } else if (const auto t = config.is_object() ? config.find("chat_template") : std::nullopt) {
    origin = config_path.string();
    if (t->is_string()) {
      source = t->string();
    } else {
      // A list of {name, template}: transformers uses "default" when no name is asked for.
      for (size_t i = 0; i < t->size(); ++i) {
        if ((*t)[i].at("name").string() == "default") source = (*t)[i].at("template").string();
      }
      SPECULA_CHECK(!source.empty(), "{}: chat_template lists no template named 'default'", origin);
    }
  } else {
    return std::nullopt;
  }
  return ChatTemplate(source, bos, eos, origin);
}

ChatTemplate::ChatTemplate(const std::string& source, std::string bos_token, std::string eos_token, std::string origin)
    : bos_token_(std::move(bos_token)), eos_token_(std::move(eos_token)), origin_(std::move(origin)) {
  try {
    template_ = std::make_unique<jinja::Template>(jinja::Template::parse(source));
  } catch (const Error& e) {
    SPECULA_CHECK(false, "chat template {}: {}", origin_, e.what());
  }
}

ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                 const nlohmann::ordered_json& extra) const {
  nlohmann::ordered_json context = extra.is_object() ? extra : nlohmann::ordered_json::object();
  context["messages"] = messages;
  context["add_generation_prompt"] = add_generation_prompt;
  context["bos_token"] = bos_token_;
  context["eos_token"] = eos_token_;
  try {
    return template_->render(context);
  } catch (const jinja::TemplateException& e) {
    // The template's own message (e.g. "Conversation roles must alternate user/assistant/..."),
    // which is what a client needs to see.
    SPECULA_CHECK(false, "the chat template refused the messages: {}", e.template_message());
  }
  return {};
}

}  // namespace specula
