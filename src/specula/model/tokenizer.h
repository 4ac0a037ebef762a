// Tokenizer: Hugging Face tokenizer.json for byte-level BPE (GPT-2 style byte alphabet), with
// added/special tokens, a BOS template, and decoding that streams only complete UTF-8. The
// pre-tokenizer regexes of Llama-3 / Qwen2 and the SentencePiece style are not read yet: such
// files are refused with a message naming what is supported.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace specula {

class Tokenizer {
 public:
  static Tokenizer from_json(const std::string& json_text);
  static Tokenizer from_file(const std::filesystem::path& path);

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
    explicit Stream(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
    std::string push(int32_t id);
    std::string finish();  // whatever is left (incomplete bytes as U+FFFD)

   private:
    const Tokenizer& tokenizer_;
    std::string pending_;
  };

 private:
  // Raw bytes of one token (byte-level tokens map back to bytes; added tokens to their text).
  std::string token_bytes(int32_t id) const;
  std::vector<int32_t> bpe(std::string_view bytes) const;

  std::vector<std::string> id_to_token_;                 // the vocabulary's strings
  std::unordered_map<std::string, int32_t> token_to_id_;
  std::map<std::pair<std::string, std::string>, int> merge_rank_;
  std::vector<std::pair<std::string, int32_t>> added_;   // content, id (longest first)
  std::unordered_map<int32_t, bool> added_ids_;          // added token id -> special
  std::vector<int32_t> prefix_ids_;                      // post-processor prefix, e.g. BOS
  bool add_prefix_space_ = false;
};

// The GPT-2 byte-to-unicode alphabet: the UTF-8 string of the code point standing for a byte.
const std::string& byte_to_unicode(uint8_t byte);

}  // namespace specula
