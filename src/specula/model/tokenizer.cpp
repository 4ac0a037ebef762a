// Byte-level BPE from tokenizer.json.
#include "specula/model/tokenizer.h"

#include <algorithm>
#include <cctype>
#include <array>
#include <functional>
#include <queue>
#include <limits>
#include <nlohmann/json.hpp>

#include "specula/core/error.h"
#include "specula/core/json_reader.h"
#include "specula/model/regex.h"
#include "specula/model/utf8.h"

namespace specula {

namespace {

using json = nlohmann::json;

// Bytes that print as themselves keep their code point; the rest get 256, 257, ... in order.
const std::array<std::string, 256>& byte_alphabet() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      t[b] = utf8_encode(printable ? b : next++);
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

constexpr const char* kSpaceMark = "\xE2\x96\x81";  // U+2581 "▁"
// The GPT-2 / ByteLevel(use_regex) pre-tokenizer pattern.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string replace_all(std::string_view text, std::string_view from, std::string_view to) {
  SPECULA_ASSERT(!from.empty());
  std::string out;
  size_t pos = 0;
  for (size_t hit = text.find(from); hit != std::string_view::npos; hit = text.find(from, pos)) {
    out.append(text.substr(pos, hit - pos));
    out.append(to);
    pos = hit + from.size();
  }
  out.append(text.substr(pos));
  return out;
}

// "<0x41>" -> 0x41, anything else -> -1.
int byte_token_value(const std::string& token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return -1;
  const auto hex = [](char ch) { return std::isxdigit(static_cast<unsigned char>(ch)) ? std::stoi(std::string(1, ch), nullptr, 16) : -1; };
  const int hi = hex(token[3]), lo = hex(token[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

}  // namespace

Tokenizer Tokenizer::from_file(const std::filesystem::path& path) { return from_json(read_text_file(path)); }

Tokenizer Tokenizer::synthetic(int vocab_size) {
  SPECULA_CHECK(vocab_size >= 256, "a synthetic tokenizer needs at least 256 ids, not {}", vocab_size);
  Tokenizer t;
  t.style_ = Style::byte_level;
  t.id_to_token_.resize(static_cast<size_t>(vocab_size));
  for (int i = 0; i < vocab_size; ++i) {
    const int byte = i < 256 ? i : 32 + (i - 256) % 95;
    t.id_to_token_[static_cast<size_t>(i)] = byte_alphabet()[static_cast<size_t>(byte)];
    if (i < 256) t.token_to_id_[t.id_to_token_[static_cast<size_t>(i)]] = i;
  }
  return t;
}

Tokenizer Tokenizer::from_folder(const std::filesystem::path& model_dir) {
  Tokenizer t = from_file(model_dir / "tokenizer.json");
  const auto config_path = model_dir / "tokenizer_config.json";
  if (!std::filesystem::exists(config_path)) return t;
  const json doc = JsonReader::parse_file(config_path, "tokenizer_config.json");
  const JsonReader config(doc, "tokenizer_config.json");
  if (!config.is_object() || !config.has("add_bos_token")) return t;
  // Only these classes rebuild the post-processor from add_bos_token; PreTrainedTokenizerFast
  // (Llama-3, the shipped model) and the others keep tokenizer.json's.
  static const char* kBosClasses[] = {"LlamaTokenizer", "LlamaTokenizerFast", "CodeLlamaTokenizer",
                                      "CodeLlamaTokenizerFast", "GemmaTokenizer", "GemmaTokenizerFast"};
  const std::string cls = config.string_or("tokenizer_class", "");
  if (std::find(std::begin(kBosClasses), std::end(kBosClasses), cls) == std::end(kBosClasses)) return t;
  const bool add_bos = config.at("add_bos_token").boolean();
  std::string bos;
  if (const auto b = config.find("bos_token")) bos = b->is_string() ? b->string() : b->at("content").string();
  if (!add_bos) {
    // Only a leading BOS goes; other template tokens stay.
    const auto id = t.token_to_id(bos);
    if (id && !t.prefix_ids_.empty() && t.prefix_ids_.front() == *id) t.prefix_ids_.erase(t.prefix_ids_.begin());
    return t;
  }
  SPECULA_CHECK(!bos.empty(), "tokenizer_config.json: add_bos_token is true but bos_token is not given");
  const auto id = t.token_to_id(bos);
  SPECULA_CHECK(id.has_value(), "tokenizer_config.json: bos_token '{}' is not in the vocabulary", bos);
  if (t.prefix_ids_.empty() || t.prefix_ids_.front() != *id) t.prefix_ids_.insert(t.prefix_ids_.begin(), *id);
  return t;
}

Tokenizer Tokenizer::from_json(const std::string& json_text) {
  const json doc = JsonReader::parse(json_text, "tokenizer.json");
  const JsonReader j(doc, "tokenizer.json");
  if (!j.is_object()) j.fail("must be a JSON object");
  Tokenizer t;
  const JsonReader model = j.at("model");
  if (!model.is_object()) model.fail("must be an object");
  const std::string type = model.string_or("type", "");
  SPECULA_CHECK(type == "BPE", "tokenizer.json: model type '{}' is not supported; supported: BPE", type);

  // Normalizer: NFC, Prepend, Replace(String), or a Sequence of them.
  auto read_norm = [&](const JsonReader& n, auto& self) -> void {
    if (n.is_null()) return;
    const std::string kind = n.at("type").string();
    if (kind == "Sequence") {
      n.at("normalizers").for_each([&](const JsonReader& step) { self(step, self); });
    } else if (kind == "NFC") {
      t.normalizers_.push_back({NormalizeStep::Kind::nfc, {}, {}});
    } else if (kind == "Prepend") {
      t.normalizers_.push_back({NormalizeStep::Kind::prepend, n.at("prepend").string(), {}});
    } else if (kind == "Replace" && n.at("pattern").has("String")) {
      std::string pattern = n.at("pattern").at("String").string();
      SPECULA_CHECK(!pattern.empty(), "tokenizer.json: a Replace normalizer with an empty pattern");
      t.normalizers_.push_back({NormalizeStep::Kind::replace, std::move(pattern), n.at("content").string()});
    } else {
      SPECULA_CHECK(false, "tokenizer.json: normalizer {} is not supported; supported: NFC, Prepend, Replace (string "
                    "pattern), Sequence", n.raw().dump(-1, ' ', false, json::error_handler_t::replace).substr(0, 120));
    }
  };
  if (const auto n = j.find("normalizer")) read_norm(*n, read_norm);

  // Pre-tokenizer: ByteLevel, Split, Metaspace, or a Sequence of them.
  bool byte_level = false, metaspace = false;
  auto read_pre = [&](const JsonReader& p, auto& self) -> void {
    if (p.is_null()) return;
    const std::string kind = p.at("type").string();
    PreStep step{};
    if (kind == "Sequence") {
      p.at("pretokenizers").for_each([&](const JsonReader& s) { self(s, self); });
      return;
    }
    if (kind == "ByteLevel") {
      byte_level = true;
      step.kind = PreStep::Kind::byte_level;
      step.add_prefix_space = p.bool_or("add_prefix_space", false);
      if (p.bool_or("use_regex", true)) step.regex = std::make_shared<Regex>(kGpt2Pattern);
    } else if (kind == "Split") {
      step.kind = PreStep::Kind::split;
      SPECULA_CHECK(!p.bool_or("invert", false), "tokenizer.json: inverted Split patterns are not supported");
      const std::string behavior = p.string_or("behavior", "Isolated");
      if (behavior == "Isolated") step.behavior = SplitBehavior::isolated;
      else if (behavior == "MergedWithPrevious") step.behavior = SplitBehavior::merged_with_previous;
      else if (behavior == "MergedWithNext") step.behavior = SplitBehavior::merged_with_next;
      else if (behavior == "Removed") step.behavior = SplitBehavior::removed;
      else SPECULA_CHECK(false, "tokenizer.json: Split behavior '{}' is not supported; supported: Isolated, "
                         "MergedWithPrevious, MergedWithNext, Removed", behavior);
      const JsonReader pattern = p.at("pattern");
      if (pattern.has("Regex")) {
        step.regex = std::make_shared<Regex>(pattern.at("Regex").string());
      } else {
        step.literal = pattern.at("String").string();
        SPECULA_CHECK(!step.literal.empty(), "tokenizer.json: an empty Split string");
      }
    } else if (kind == "Metaspace") {
      metaspace = true;
      step.kind = PreStep::Kind::metaspace;
      step.literal = p.string_or("replacement", kSpaceMark);
      SPECULA_CHECK(!step.literal.empty(), "tokenizer.json: an empty Metaspace replacement");
      step.prepend_scheme = p.string_or("prepend_scheme", p.bool_or("add_prefix_space", true) ? "always" : "never");
      step.split = p.bool_or("split", true);
    } else {
      SPECULA_CHECK(false, "tokenizer.json: pre_tokenizer '{}' is not supported; supported: ByteLevel, Split, "
                    "Metaspace, Sequence", kind);
    }
    t.pre_steps_.push_back(std::move(step));
  };
  if (const auto p = j.find("pre_tokenizer")) read_pre(*p, read_pre);
  // Byte-level models map bytes to stand-in characters; the others run BPE over characters,
  // with "▁" for spaces (from the normalizer or Metaspace).
  const bool space_marks =
      metaspace || std::any_of(t.normalizers_.begin(), t.normalizers_.end(), [](const NormalizeStep& n) {
        return n.kind == NormalizeStep::Kind::replace && n.b == kSpaceMark;
      });
  SPECULA_CHECK(!(byte_level && space_marks), "tokenizer.json mixes ByteLevel with SentencePiece-style spaces");
  t.style_ = space_marks ? Style::sentencepiece : Style::byte_level;
  SPECULA_CHECK(byte_level || space_marks, "tokenizer.json: neither ByteLevel nor SentencePiece-style ('▁') spaces; "
                "specula reads these two BPE styles");
  t.ignore_merges_ = model.bool_or("ignore_merges", false);
  t.byte_fallback_ = model.bool_or("byte_fallback", false);

  // The vocabulary may have no gaps (checked below), so every id is below the number of entries
  // (added tokens often repeat vocabulary entries): a bound checked before an id sizes anything.
  const JsonReader vocab = model.at("vocab");
  if (!vocab.is_object()) vocab.fail("must be an object of token: id");
  const std::optional<JsonReader> added = j.find("added_tokens");
  const int64_t max_id = static_cast<int64_t>(vocab.raw().size() + (added ? added->size() : 0)) - 1;
  SPECULA_CHECK(max_id < INT32_MAX, "tokenizer.json: {} entries are more than token ids can number", max_id + 1);
  vocab.for_each_member([&](const std::string& token, const JsonReader& id) {
    const auto i = static_cast<size_t>(id.integer(0, max_id));
    if (t.id_to_token_.size() <= i) t.id_to_token_.resize(i + 1);
    t.id_to_token_[i] = token;
    t.token_to_id_[token] = static_cast<int32_t>(i);
  });
  if (const auto unk = model.find("unk_token"); unk && unk->is_string()) {
    const auto it = t.token_to_id_.find(unk->string());
    if (it != t.token_to_id_.end()) t.unk_id_ = it->second;
  }
  int rank = 0;
  if (const auto merges = model.find("merges")) {
    merges->for_each([&](const JsonReader& m) {
      std::pair<std::string, std::string> pair;
      if (m.is_string()) {
        const std::string s = m.string();
        const size_t space = s.find(' ');
        SPECULA_CHECK(space != std::string::npos, "tokenizer.json: merge '{}' has no space", s);
        pair = {s.substr(0, space), s.substr(space + 1)};
      } else {
        if (!m.is_array() || m.size() != 2) m.fail("must be 'a b' or [a, b]");
        pair = {m[0].string(), m[1].string()};
      }
      t.merge_rank_.emplace(pair.first + '\xFF' + pair.second, rank++);
    });
  }
  if (added) {
    added->for_each([&](const JsonReader& a) {
      const auto id = static_cast<int32_t>(a.at("id").integer(0, max_id));
      const std::string content = a.at("content").string();
      if (t.id_to_token_.size() <= static_cast<size_t>(id)) t.id_to_token_.resize(static_cast<size_t>(id) + 1);
      t.id_to_token_[static_cast<size_t>(id)] = content;
      t.token_to_id_[content] = id;
      t.added_.emplace_back(content, id);
      t.added_ids_[id] = a.bool_or("special", false);
    });
    std::stable_sort(t.added_.begin(), t.added_.end(),
                     [](const auto& x, const auto& y) { return x.first.size() > y.first.size(); });
  }
  if (const auto pp = j.find("post_processor"); pp && pp->is_object()) {
    std::vector<JsonReader> steps;
    if (pp->string_or("type", "") == "Sequence") {
      pp->at("processors").for_each([&](const JsonReader& s) { steps.push_back(s); });
    } else {
      steps.push_back(*pp);
    }
    for (const JsonReader& step : steps) {
      const std::string pp_type = step.string_or("type", "");
      if (pp_type == "TemplateProcessing") {
        const JsonReader single = step.at("single");
        for (size_t i = 0; i < single.size(); ++i) {
          const JsonReader piece = single[i];
          if (piece.has("Sequence")) break;  // only a prefix of special tokens is read
          const std::string name = piece.at("SpecialToken").at("id").string();
          const auto special = step.at("special_tokens").find(name);
          SPECULA_CHECK(special.has_value(), "tokenizer.json: template token '{}' is undefined", name);
          special->at("ids").for_each([&](const JsonReader& id) {
            t.prefix_ids_.push_back(static_cast<int32_t>(id.integer(0, max_id)));
          });
        }
      } else {
        SPECULA_CHECK(pp_type == "ByteLevel", "tokenizer.json: post_processor '{}' is not supported; supported: "
                      "TemplateProcessing, ByteLevel, Sequence", pp_type);
      }
    }
  }
  // Decoder: ByteLevel, Metaspace, or Sequence of Replace / ByteFallback / Fuse / Strip.
  if (const auto d = j.find("decoder"); d && d->is_object()) {
    std::vector<JsonReader> steps;
    if (d->string_or("type", "") == "Sequence") {
      d->at("decoders").for_each([&](const JsonReader& s) { steps.push_back(s); });
    } else {
      steps.push_back(*d);
    }
    for (const JsonReader& s : steps) {
      const std::string kind = s.string_or("type", "");
      if (kind == "Strip") {
        t.strip_leading_space_ = s.int_or("start", 0, 0, INT32_MAX) > 0;
      } else if (kind == "Metaspace") {
        t.strip_leading_space_ = s.string_or("prepend_scheme", "always") != "never";
      } else {
        SPECULA_CHECK(kind == "ByteLevel" || kind == "Replace" || kind == "ByteFallback" || kind == "Fuse",
                      "tokenizer.json: decoder '{}' is not supported; supported: ByteLevel, Metaspace, Replace, "
                      "ByteFallback, Fuse, Strip", kind);
      }
    }
  }
  // Entries that share an id leave another id without a token.
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

namespace {

// Splits every piece at the matches of a regex or literal, arranging matches by behavior.
std::vector<std::string> split_pieces(const std::vector<std::string>& pieces, const Regex* regex,
                                      const std::string& literal, int behavior) {
  enum { kIsolated, kMergedWithPrevious, kMergedWithNext, kRemoved };
  std::vector<std::string> out;
  for (const std::string& piece : pieces) {
    std::vector<std::pair<size_t, size_t>> matches;
    if (regex != nullptr) {
      matches = regex->find_all(piece);
    } else {
      for (size_t pos = piece.find(literal); pos != std::string::npos; pos = piece.find(literal, pos + literal.size())) {
        matches.emplace_back(pos, pos + literal.size());
      }
    }
    std::string carry;  // a match waiting to be merged into the next piece
    size_t last = 0;
    auto push = [&](std::string s) {
      if (!s.empty()) out.push_back(std::move(s));
    };
    for (const auto& [b, e] : matches) {
      std::string gap = piece.substr(last, b - last), match = piece.substr(b, e - b);
      switch (behavior) {
        case kIsolated: push(gap); push(match); break;
        case kMergedWithPrevious: push(gap + match); break;
        case kMergedWithNext: push(carry + gap); carry = match; break;
        default: push(gap); break;
      }
      last = e;
    }
    push(carry + piece.substr(last));
  }
  return out;
}

}  // namespace

std::vector<std::string> Tokenizer::pre_tokenize(std::string_view segment, bool at_input_start) const {
  std::string text(segment);
  for (const NormalizeStep& n : normalizers_) {
    switch (n.kind) {
      case NormalizeStep::Kind::nfc: text = utf8_nfc(text); break;
      case NormalizeStep::Kind::prepend:
        if (!text.empty()) text = n.a + text;  // Hugging Face prepends to any non-empty text
        break;
      case NormalizeStep::Kind::replace: text = replace_all(text, n.a, n.b); break;
    }
  }
  std::vector<std::string> pieces{text};
  for (const PreStep& step : pre_steps_) {
    switch (step.kind) {
      case PreStep::Kind::split:
        pieces = split_pieces(pieces, step.regex.get(), step.literal, static_cast<int>(step.behavior));
        break;
      case PreStep::Kind::byte_level:
        if (step.add_prefix_space && at_input_start && !pieces.empty() && !pieces[0].empty() && pieces[0][0] != ' ') {
          pieces[0] = " " + pieces[0];
        }
        if (step.regex) pieces = split_pieces(pieces, step.regex.get(), {}, 0);
        break;
      case PreStep::Kind::metaspace:
        for (std::string& p : pieces) p = replace_all(p, " ", step.literal);
        if (!pieces.empty() && !pieces[0].empty() && pieces[0].rfind(step.literal, 0) != 0 &&
            (step.prepend_scheme == "always" || (step.prepend_scheme == "first" && at_input_start))) {
          pieces[0] = step.literal + pieces[0];
        }
        if (step.split) pieces = split_pieces(pieces, nullptr, step.literal, 2);
        break;
    }
  }
  return pieces;
}

std::vector<int32_t> Tokenizer::bpe(std::string_view piece) const {
  if (ignore_merges_) {
    std::string whole;
    if (style_ == Style::byte_level) {
      for (unsigned char b : piece) whole += byte_alphabet()[b];
    } else {
      whole = std::string(piece);
    }
    const auto it = token_to_id_.find(whole);
    if (it != token_to_id_.end()) return {it->second};
  }
  // Initial symbols: byte stand-ins (byte level) or UTF-8 characters (SentencePiece style).
  std::vector<std::string> symbols;
  if (style_ == Style::byte_level) {
    for (unsigned char b : piece) symbols.push_back(byte_alphabet()[b]);
  } else {
    for (size_t i = 0; i < piece.size();) {
      const size_t n = std::min(utf8_sequence_length(static_cast<uint8_t>(piece[i])), piece.size() - i);
      symbols.emplace_back(piece.substr(i, n));
      i += n;
    }
  }
  // Merge the lowest-ranked adjacent pair (the leftmost on ties, as Hugging Face does) until
  // none is left. A min-heap of candidates keeps each merge O(log n); a candidate whose sides
  // changed since it was pushed is stale and skipped when popped.
  struct Node {
    int prev, next;
    int version = 0;
    bool alive = true;
  };
  std::vector<Node> nodes(symbols.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    nodes[i].prev = static_cast<int>(i) - 1;
    nodes[i].next = i + 1 < nodes.size() ? static_cast<int>(i) + 1 : -1;
  }
  struct Candidate {
    int rank, left, right, left_version, right_version;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto consider = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const auto it = merge_rank_.find(symbols[static_cast<size_t>(left)] + '\xFF' + symbols[static_cast<size_t>(right)]);
    if (it != merge_rank_.end()) {
      heap.push({it->second, left, right, nodes[static_cast<size_t>(left)].version, nodes[static_cast<size_t>(right)].version});
    }
  };
  for (size_t i = 0; i + 1 < symbols.size(); ++i) consider(static_cast<int>(i), static_cast<int>(i) + 1);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Node& l = nodes[static_cast<size_t>(c.left)];
    Node& r = nodes[static_cast<size_t>(c.right)];
    if (!l.alive || !r.alive || l.next != c.right || l.version != c.left_version || r.version != c.right_version) continue;
    symbols[static_cast<size_t>(c.left)] += symbols[static_cast<size_t>(c.right)];
    ++l.version;
    r.alive = false;
    l.next = r.next;
    if (r.next >= 0) nodes[static_cast<size_t>(r.next)].prev = c.left;
    consider(l.prev, c.left);
    consider(c.left, l.next);
  }
  {
    std::vector<std::string> merged;
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (nodes[i].alive) merged.push_back(std::move(symbols[i]));
    }
    symbols = std::move(merged);
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
  size_t segment_start = 0;
  auto flush = [&] {
    if (segment.empty()) return;
    for (const std::string& piece : pre_tokenize(segment, segment_start == 0)) {
      const auto part = bpe(piece);
      ids.insert(ids.end(), part.begin(), part.end());
    }
    segment.clear();
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
    if (!matched) {
      if (segment.empty()) segment_start = i;
      segment += text[i++];
    }
  }
  flush();
  return ids;
}

std::string Tokenizer::token_bytes(int32_t id, bool first) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size()) return {};
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
    const size_t n = utf8_sequence_length(static_cast<uint8_t>(token[i]));
    const auto it = table.find(token.substr(i, n));
    // Characters outside the byte alphabet stand for their own UTF-8 bytes (as in HF).
    if (it != table.end()) {
      bytes += static_cast<char>(it->second);
    } else {
      bytes.append(token, i, n);
    }
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
  return utf8_lossy(bytes);
}

std::string Tokenizer::Stream::push(int32_t id) {
  if (tokenizer_.is_special(id)) return {};
  pending_ += tokenizer_.token_bytes(id, !started_);
  started_ = true;
  // Emit everything except a trailing sequence that more bytes could still complete.
  const size_t final_len = utf8_final_prefix(pending_);
  std::string out = utf8_lossy(std::string_view(pending_).substr(0, final_len));
  pending_.erase(0, final_len);
  return out;
}

std::string Tokenizer::Stream::finish() {
  std::string out = utf8_lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace specula
