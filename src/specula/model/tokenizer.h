// Tokenizer: Hugging Face tokenizer.json with a BPE model, in the two styles LLMs ship:
//  - byte-level (GPT-2, Llama-3, Qwen2, the shipped byte model): regex Split pre-tokenizers
//    and/or ByteLevel (optionally with the GPT-2 regex), every byte mapped to a printable
//    stand-in, BPE merges over those;
//  - SentencePiece-style (Llama-2, Mistral): a Prepend/Replace normalizer or a Metaspace
//    pre-tokenizer turning spaces into "▁", BPE over characters, unknown characters falling
//    back to <0xXX> byte tokens.
// Added/special tokens are matched in the text first; a template post-processor adds the BOS;
// decoding streams only complete UTF-8.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "specula/model/regex.h"

namespace specula {

class Tokenizer {
 public:
  static Tokenizer from_json(const std::string& json_text);
  static Tokenizer from_file(const std::filesystem::path& path);
  // A model folder's tokenizer.json, with tokenizer_config.json's add_bos_token applied for the
  // tokenizer classes whose transformers implementation rebuilds the post-processor from it
  // (Llama / CodeLlama / Gemma: DeepSeek-V3 ships no template but add_bos_token true, and gets a
  // BOS as transformers gives it).
  static Tokenizer from_folder(const std::filesystem::path& model_dir);

  // For synthetic (random-weight) benchmark models: a byte-level vocabulary of vocab_size ids
  // where ids 0-255 are the bytes and every higher id stands for a printable ASCII byte, so any
  // output decodes to visible text.
  static Tokenizer synthetic(int vocab_size);

  // The post-processor's prefix (e.g. BOS) that encode(text, true) adds.
  const std::vector<int32_t>& prefix_ids() const { return prefix_ids_; }
  // The raw bytes a token stands for (a part of a UTF-8 sequence for byte tokens); empty for ids
  // outside the vocabulary.
  std::string token_raw_bytes(int32_t id) const { return token_bytes(id, false); }

  // Text -> ids; with add_special_tokens the post-processor's prefix (e.g. BOS) is added.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // Ids -> text (special tokens dropped when skip_special_tokens). Invalid UTF-8 from partial
  // byte sequences becomes U+FFFD, as Hugging Face does.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = true) const;

  int vocab_size() const { return static_cast<int>(id_to_token_.size()); }
  std::optional<int32_t> token_to_id(const std::string& token) const;
  bool is_special(int32_t id) const {
    const auto it = added_ids_.find(id);
    return it != added_ids_.end() && it->second;
  }

  // Incremental decoding: push ids, get back the text that became complete (never a partial
  // UTF-8 sequence).
  class Stream {
   public:
    // continuing: the ids follow earlier text (a prompt), so a decoder's "strip the first
    // space" rule does not apply to the first one.
    explicit Stream(const Tokenizer& tokenizer, bool continuing = false)
        : tokenizer_(tokenizer), started_(continuing) {}
    std::string push(int32_t id);
    std::string finish();  // whatever is left (incomplete bytes as U+FFFD)

   private:
    const Tokenizer& tokenizer_;
    std::string pending_;
    bool started_;
  };

 private:
  enum class Style { byte_level, sentencepiece };
  enum class SplitBehavior { isolated, merged_with_previous, merged_with_next, removed };

  // One normalizer or pre-tokenizer step of tokenizer.json, in file order.
  struct NormalizeStep {
    enum class Kind { nfc, prepend, replace } kind;
    std::string a, b;  // prepend: a; replace: a -> b
  };
  struct PreStep {
    enum class Kind { split, byte_level, metaspace } kind;
    std::shared_ptr<const Regex> regex;  // split by regex ...
    std::string literal;                 // ... or by a literal string
    SplitBehavior behavior = SplitBehavior::isolated;
    bool add_prefix_space = false;       // byte_level
    std::string prepend_scheme;          // metaspace: always, first, never
    bool split = true;                   // metaspace
  };

  std::vector<std::string> pre_tokenize(std::string_view segment, bool at_input_start) const;
  std::vector<int32_t> bpe(std::string_view piece) const;
  // Raw bytes a token stands for; `first` marks the first token of the output (Strip decoders).
  // Ids outside the vocabulary (padding rows of a model's embedding) stand for nothing.
  std::string token_bytes(int32_t id, bool first) const;

  Style style_ = Style::byte_level;
  std::vector<NormalizeStep> normalizers_;
  std::vector<PreStep> pre_steps_;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;  // a piece that is itself a token is taken whole (Llama-3)
  int32_t unk_id_ = -1;
  bool strip_leading_space_ = false;  // decoder drops the first " "

  std::vector<std::string> id_to_token_;
  std::unordered_map<std::string, int32_t> token_to_id_;
  // Rank of each merge, keyed by "left\xFFright" (0xFF never occurs in UTF-8 text).
  std::unordered_map<std::string, int> merge_rank_;
  std::vector<std::pair<std::string, int32_t>> added_;  // content, id (longest first)
  std::unordered_map<int32_t, bool> added_ids_;         // added token id -> special
  std::vector<int32_t> prefix_ids_;                     // post-processor prefix, e.g. BOS
};

}  // namespace specula
