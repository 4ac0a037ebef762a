// Byte-level BPE from tokenizer.json.
#include "specula/model/tokenizer.h"

#include <algorithm>
#include <cctype>
#include <array>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "specula/core/error.h"
#include "specula/model/regex.h"

namespace specula {

namespace {

using json = nlohmann::json;

std::string utf8_of(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// Bytes that print as themselves keep their code point; the rest get 256, 257, ... in order.
const std::array<std::string, 256>& byte_alphabet() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      t[b] = utf8_of(printable ? b : next++);
    }
    return t;
  }();
  return table;
}

const std::unordered_map<std::string, uint8_t>& unicode_to_byte() {
  static const std::unordered_map<std::string, uint8_t> table = [] {
    std::unordered_map<std::string, uint8_t> t;
    for (int b = 0; b < 256; ++b) t[byte_alphabet()[static_cast<size_t>(b)]] = static_cast<uint8_t>(b);
    return t;
  }();
  return table;
}

// Length of the UTF-8 sequence starting at s[i] (1 for invalid lead bytes).
size_t utf8_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead >> 5) == 0x6) return 2;
  if ((lead >> 4) == 0xE) return 3;
  if ((lead >> 3) == 0x1E) return 4;
  return 1;
}

// Replaces invalid or incomplete UTF-8 sequences with U+FFFD.
std::string sanitize_utf8(const std::string& bytes) {
  std::string out;
  size_t i = 0;
  while (i < bytes.size()) {
    const auto lead = static_cast<unsigned char>(bytes[i]);
    const size_t n = utf8_length(lead);
    bool ok = lead < 0x80 || n > 1;
    if (ok && i + n > bytes.size()) ok = false;
    for (size_t k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(bytes[i + k]) & 0xC0) == 0x80;
    if (ok) {
      out.append(bytes, i, n);
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

constexpr const char* kSpaceMark = "\xE2\x96\x81";  // U+2581 "▁"
// The GPT-2 / ByteLevel(use_regex) pre-tokenizer pattern.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string replace_all(std::string text, std::string_view from, std::string_view to) {
  size_t pos = 0;
  while ((pos = text.find(from, pos)) != std::string::npos) {
    text.replace(pos, from.size(), to);
    pos += to.size();
  }
  return text;
}

// "<0x41>" -> 0x41, anything else -> -1.
int byte_token_value(const std::string& token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return -1;
  const auto hex = [](char ch) { return std::isxdigit(static_cast<unsigned char>(ch)) ? std::stoi(std::string(1, ch), nullptr, 16) : -1; };
  const int hi = hex(token[3]), lo = hex(token[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

}  // namespace

const std::string& byte_to_unicode(uint8_t byte) { return byte_alphabet()[byte]; }

Tokenizer Tokenizer::from_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  SPECULA_CHECK(in.good(), "cannot read tokenizer file {}", path.string());
  std::stringstream text;
  text << in.rdbuf();
  return from_json(text.str());
}

Tokenizer Tokenizer::from_json(const std::string& json_text) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::parse_error& e) {
    SPECULA_CHECK(false, "tokenizer.json is not valid JSON: {}", e.what());
  }
  Tokenizer t;
  SPECULA_CHECK(j.contains("model") && j["model"].is_object(), "tokenizer.json has no 'model'");
  const json& model = j["model"];
  const std::string type = model.value("type", "");
  SPECULA_CHECK(type == "BPE", "tokenizer.json: model type '{}' is not supported; supported: BPE", type);

  // Pre-tokenizer: ByteLevel, Split (Isolated), Metaspace, or a Sequence of them.
  bool saw_byte_level = false;
  auto read_pre = [&](const json& p, auto& self) -> void {
    if (p.is_null()) return;
    const std::string kind = p.value("type", "");
    if (kind == "Sequence") {
      for (const json& step : p["pretokenizers"]) self(step, self);
    } else if (kind == "ByteLevel") {
      saw_byte_level = true;
      t.add_prefix_space_ = p.value("add_prefix_space", false);
      if (p.value("use_regex", true)) t.splits_.push_back(std::make_shared<Regex>(kGpt2Pattern));
    } else if (kind == "Split") {
      const std::string behavior = p.value("behavior", "");
      SPECULA_CHECK(behavior == "Isolated" && !p.value("invert", false),
                    "tokenizer.json: Split behavior '{}' is not supported; supported: Isolated", behavior);
      SPECULA_CHECK(p["pattern"].contains("Regex"), "tokenizer.json: Split patterns must be Regex");
      t.splits_.push_back(std::make_shared<Regex>(p["pattern"]["Regex"].get<std::string>()));
    } else if (kind == "Metaspace") {
      t.style_ = Style::sentencepiece;
      t.replace_spaces_ = true;
      const std::string scheme = p.value("prepend_scheme", p.value("add_prefix_space", true) ? "always" : "never");
      if (scheme != "never") t.space_prepend_ = kSpaceMark;
      t.prepend_first_only_ = scheme == "first";
    } else {
      SPECULA_CHECK(false, "tokenizer.json: pre_tokenizer '{}' is not supported; supported: ByteLevel, Split, "
                    "Metaspace, Sequence", kind);
    }
  };
  if (j.contains("pre_tokenizer")) read_pre(j["pre_tokenizer"], read_pre);
  // Normalizer: none, or SentencePiece's Prepend("▁") + Replace(" ", "▁").
  if (j.contains("normalizer") && !j["normalizer"].is_null()) {
    const json& n = j["normalizer"];
    std::vector<json> steps;
    if (n.value("type", "") == "Sequence") {
      for (const json& s : n["normalizers"]) steps.push_back(s);
    } else {
      steps.push_back(n);
    }
    for (const json& s : steps) {
      const std::string kind = s.value("type", "");
      if (kind == "Prepend") {
        t.space_prepend_ = s["prepend"].get<std::string>();
      } else if (kind == "Replace" && s["pattern"].contains("String") && s["pattern"]["String"] == " " &&
                 s["content"] == kSpaceMark) {
        t.replace_spaces_ = true;
      } else {
        SPECULA_CHECK(false, "tokenizer.json: normalizer {} is not supported; supported: Prepend, Replace(' ' -> '▁')",
                      s.dump().substr(0, 120));
      }
    }
    t.style_ = Style::sentencepiece;
  }
  SPECULA_CHECK(!(saw_byte_level && t.style_ == Style::sentencepiece),
                "tokenizer.json mixes ByteLevel with SentencePiece-style normalisation");
  t.byte_fallback_ = model.value("byte_fallback", false);

  SPECULA_CHECK(model.contains("vocab") && model["vocab"].is_object(), "tokenizer.json: model has no vocab");
  for (const auto& [token, id] : model["vocab"].items()) {
    SPECULA_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0, "tokenizer.json: vocab id of '{}' is bad", token);
    const auto i = static_cast<size_t>(id.get<int64_t>());
    if (t.id_to_token_.size() <= i) t.id_to_token_.resize(i + 1);
    t.id_to_token_[i] = token;
    t.token_to_id_[token] = static_cast<int32_t>(i);
  }
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    const auto it = t.token_to_id_.find(model["unk_token"].get<std::string>());
    if (it != t.token_to_id_.end()) t.unk_id_ = it->second;
  }
  int rank = 0;
  if (model.contains("merges")) {
    for (const auto& m : model["merges"]) {
      std::pair<std::string, std::string> pair;
      if (m.is_string()) {
        const std::string s = m.get<std::string>();
        const size_t space = s.find(' ');
        SPECULA_CHECK(space != std::string::npos, "tokenizer.json: merge '{}' has no space", s);
        pair = {s.substr(0, space), s.substr(space + 1)};
      } else {
        SPECULA_CHECK(m.is_array() && m.size() == 2, "tokenizer.json: a merge is neither 'a b' nor [a, b]");
        pair = {m[0].get<std::string>(), m[1].get<std::string>()};
      }
      t.merge_rank_.emplace(pair, rank++);
    }
  }
  if (j.contains("added_tokens")) {
    for (const auto& a : j["added_tokens"]) {
      const auto id = a["id"].get<int32_t>();
      const std::string content = a["content"].get<std::string>();
      if (t.id_to_token_.size() <= static_cast<size_t>(id)) t.id_to_token_.resize(static_cast<size_t>(id) + 1);
      t.id_to_token_[static_cast<size_t>(id)] = content;
      t.token_to_id_[content] = id;
      t.added_.emplace_back(content, id);
      t.added_ids_[id] = a.value("special", false);
    }
    std::stable_sort(t.added_.begin(), t.added_.end(),
                     [](const auto& x, const auto& y) { return x.first.size() > y.first.size(); });
  }
  if (j.contains("post_processor") && j["post_processor"].is_object()) {
    const json& pp = j["post_processor"];
    std::vector<json> steps;
    if (pp.value("type", "") == "Sequence") {
      for (const json& s : pp["processors"]) steps.push_back(s);
    } else {
      steps.push_back(pp);
    }
    for (const json& step : steps) {
      const std::string pp_type = step.value("type", "");
      if (pp_type == "TemplateProcessing") {
        for (const auto& piece : step["single"]) {
          if (piece.contains("Sequence")) break;  // only a prefix of special tokens is read
          const std::string name = piece["SpecialToken"]["id"].get<std::string>();
          const auto it = step["special_tokens"].find(name);
          SPECULA_CHECK(it != step["special_tokens"].end(), "tokenizer.json: template token '{}' is undefined", name);
          for (const auto& id : (*it)["ids"]) t.prefix_ids_.push_back(id.get<int32_t>());
        }
      } else {
        SPECULA_CHECK(pp_type == "ByteLevel", "tokenizer.json: post_processor '{}' is not supported; supported: "
                      "TemplateProcessing, ByteLevel, Sequence", pp_type);
      }
    }
  }
  // Decoder: ByteLevel, Metaspace, or Sequence of Replace / ByteFallback / Fuse / Strip.
  if (j.contains("decoder") && j["decoder"].is_object()) {
    const json& d = j["decoder"];
    std::vector<json> steps;
    if (d.value("type", "") == "Sequence") {
      for (const json& s : d["decoders"]) steps.push_back(s);
    } else {
      steps.push_back(d);
    }
    for (const json& s : steps) {
      const std::string kind = s.value("type", "");
      if (kind == "Strip") {
        t.strip_leading_space_ = s.value("start", 0) > 0;
      } else if (kind == "Metaspace") {
        t.strip_leading_space_ = s.value("prepend_scheme", std::string("always")) != "never";
      } else {
        SPECULA_CHECK(kind == "ByteLevel" || kind == "Replace" || kind == "ByteFallback" || kind == "Fuse",
                      "tokenizer.json: decoder '{}' is not supported; supported: ByteLevel, Metaspace, Replace, "
                      "ByteFallback, Fuse, Strip", kind);
      }
    }
  }
  for (size_t i = 0; i < t.id_to_token_.size(); ++i) {
    SPECULA_CHECK(!t.id_to_token_[i].empty(), "tokenizer.json: id {} has no token (the vocabulary has a gap)", i);
  }
  return t;
}

std::optional<int32_t> Tokenizer::token_to_id(const std::string& token) const {
  const auto it = token_to_id_.find(token);
  if (it == token_to_id_.end()) return std::nullopt;
  return it->second;
}

std::vector<std::string> Tokenizer::pre_tokenize(std::string_view segment, bool first_segment) const {
  std::string text(segment);
  if (style_ == Style::sentencepiece) {
    if (replace_spaces_) text = replace_all(text, " ", kSpaceMark);
    if (!space_prepend_.empty() && (!prepend_first_only_ || first_segment) && text.rfind(space_prepend_, 0) != 0) {
      text = space_prepend_ + text;
    }
  } else if (add_prefix_space_ && first_segment && !text.empty() && text[0] != ' ') {
    text = " " + text;
  }
  std::vector<std::string> pieces{text};
  for (const auto& regex : splits_) {
    std::vector<std::string> next;
    for (const std::string& piece : pieces) {
      size_t last = 0;
      for (const auto& [b, e] : regex->find_all(piece)) {
        if (b > last) next.push_back(piece.substr(last, b - last));
        next.push_back(piece.substr(b, e - b));
        last = e;
      }
      if (last < piece.size()) next.push_back(piece.substr(last));
    }
    pieces = std::move(next);
  }
  return pieces;
}

std::vector<int32_t> Tokenizer::bpe(std::string_view piece) const {
  // Initial symbols: byte stand-ins (byte level) or UTF-8 characters (SentencePiece style).
  std::vector<std::string> symbols;
  if (style_ == Style::byte_level) {
    for (unsigned char b : piece) symbols.push_back(byte_alphabet()[b]);
  } else {
    for (size_t i = 0; i < piece.size();) {
      const size_t n = std::min(utf8_length(static_cast<unsigned char>(piece[i])), piece.size() - i);
      symbols.emplace_back(piece.substr(i, n));
      i += n;
    }
  }
  // Repeatedly merge the adjacent pair with the lowest rank.
  for (;;) {
    int best_rank = std::numeric_limits<int>::max();
    size_t best = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      const auto it = merge_rank_.find({symbols[i], symbols[i + 1]});
      if (it != merge_rank_.end() && it->second < best_rank) {
        best_rank = it->second;
        best = i;
      }
    }
    if (best_rank == std::numeric_limits<int>::max()) break;
    symbols[best] += symbols[best + 1];
    symbols.erase(symbols.begin() + static_cast<int64_t>(best) + 1);
  }
  std::vector<int32_t> ids;
  for (const auto& s : symbols) {
    const auto it = token_to_id_.find(s);
    if (it != token_to_id_.end()) {
      ids.push_back(it->second);
    } else if (byte_fallback_) {
      for (unsigned char b : s) {
        const auto bt = token_to_id_.find(fmt::format("<0x{:02X}>", b));
        SPECULA_CHECK(bt != token_to_id_.end(), "the tokenizer has byte_fallback but no token <0x{:02X}>", b);
        ids.push_back(bt->second);
      }
    } else {
      SPECULA_CHECK(unk_id_ >= 0, "the tokenizer has no token for the piece '{}' and no unk_token", s);
      ids.push_back(unk_id_);
    }
  }
  return ids;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int32_t> ids = add_special_tokens ? prefix_ids_ : std::vector<int32_t>{};
  std::string segment;
  bool first = true;
  auto flush = [&] {
    if (segment.empty()) return;
    for (const std::string& piece : pre_tokenize(segment, first)) {
      const auto part = bpe(piece);
      ids.insert(ids.end(), part.begin(), part.end());
    }
    segment.clear();
    first = false;
  };
  size_t i = 0;
  while (i < text.size()) {
    bool matched = false;
    for (const auto& [content, id] : added_) {
      if (!content.empty() && text.compare(i, content.size(), content) == 0) {
        flush();
        ids.push_back(id);
        i += content.size();
        matched = true;
        break;
      }
    }
    if (!matched) segment += text[i++];
  }
  flush();
  return ids;
}

std::string Tokenizer::token_bytes(int32_t id, bool first) const {
  SPECULA_CHECK(id >= 0 && static_cast<size_t>(id) < id_to_token_.size(), "token id {} is out of range [0, {})", id,
                id_to_token_.size());
  const std::string& token = id_to_token_[static_cast<size_t>(id)];
  if (added_ids_.count(id) != 0) return token;  // added tokens are literal text
  if (style_ == Style::sentencepiece) {
    if (byte_fallback_) {
      const int byte = byte_token_value(token);
      if (byte >= 0) return std::string(1, static_cast<char>(byte));
    }
    std::string text = replace_all(token, kSpaceMark, " ");
    if (first && strip_leading_space_ && !text.empty() && text[0] == ' ') text.erase(0, 1);
    return text;
  }
  std::string bytes;
  const auto& table = unicode_to_byte();
  size_t i = 0;
  while (i < token.size()) {
    const size_t n = utf8_length(static_cast<unsigned char>(token[i]));
    const auto it = table.find(token.substr(i, n));
    SPECULA_CHECK(it != table.end(), "token {} ('{}') is not in the byte-level alphabet", id, token);
    bytes += static_cast<char>(it->second);
    i += n;
  }
  return bytes;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string bytes;
  bool first = true;
  for (int32_t id : ids) {
    if (skip_special_tokens && is_special(id)) continue;
    bytes += token_bytes(id, first);
    first = false;
  }
  return sanitize_utf8(bytes);
}

std::string Tokenizer::Stream::push(int32_t id) {
  if (tokenizer_.is_special(id)) return {};
  pending_ += tokenizer_.token_bytes(id, !started_);
  started_ = true;
  // Emit everything up to the last position where a complete UTF-8 sequence ends.
  size_t complete = 0;
  size_t i = 0;
  while (i < pending_.size()) {
    const size_t n = utf8_length(static_cast<unsigned char>(pending_[i]));
    if (i + n > pending_.size()) break;
    i += n;
    complete = i;
  }
  std::string out = sanitize_utf8(pending_.substr(0, complete));
  pending_.erase(0, complete);
  return out;
}

std::string Tokenizer::Stream::finish() {
  std::string out = sanitize_utf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace specula
