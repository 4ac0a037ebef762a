// Tokenizer: the shipped byte-level tokenizer (ids = <s> then the UTF-8 bytes), round trips over
// Unicode, digits and whitespace runs, special tokens in text, streaming that never splits a
// UTF-8 sequence, a hand-made BPE with merges, and clear refusals.
#include <gtest/gtest.h>

#include <filesystem>
#include <cstdint>
#include <fstream>
#include <random>

#include "specula/core/error.h"
#include "specula/model/tokenizer.h"
#include "specula/model/utf8.h"

namespace specula {
namespace {

const std::filesystem::path kShipped = std::filesystem::path(SPECULA_SOURCE_DIR) / "models/specula-byte-6m/tokenizer.json";

TEST(Tokenizer, ShippedByteLevelIdsAreBytes) {
  const Tokenizer t = Tokenizer::from_file(kShipped);
  EXPECT_EQ(t.vocab_size(), 259);
  for (const std::string text : {"Hello, world!", "  two  spaces\tand\ttabs\n\n", "digits 0123456789 3.14",
                                 "Unicode: héllo wörld — 日本語 🌍 😀", ""}) {
    const auto ids = t.encode(text);
    ASSERT_EQ(ids.size(), text.size() + 1) << text;
    EXPECT_EQ(ids[0], 256);
    for (size_t i = 0; i < text.size(); ++i) EXPECT_EQ(ids[i + 1], static_cast<unsigned char>(text[i]));
    EXPECT_EQ(t.decode(ids), text);
    EXPECT_EQ(t.encode(text, false).size(), text.size());
  }
}

TEST(Tokenizer, SpecialTokensInTextAndDecoding) {
  const Tokenizer t = Tokenizer::from_file(kShipped);
  EXPECT_EQ(t.encode("a</s>b", false), (std::vector<int32_t>{97, 257, 98}));
  EXPECT_EQ(t.decode(std::vector<int32_t>{256, 104, 105, 257}), "hi");
  EXPECT_EQ(t.decode(std::vector<int32_t>{256, 104, 105, 257}, false), "<s>hi</s>");
  EXPECT_TRUE(t.is_special(258));
  EXPECT_EQ(t.token_to_id("<pad>"), 258);
  // Ids past the vocabulary (padding rows of a model's embedding) decode to nothing.
  EXPECT_EQ(t.decode(std::vector<int32_t>{104, 300, 105}), "hi");
}

TEST(Tokenizer, StreamingNeverSplitsUtf8) {
  const Tokenizer t = Tokenizer::from_file(kShipped);
  const std::string text = "aé🌍日b";
  Tokenizer::Stream stream(t);
  std::string out;
  for (int32_t id : t.encode(text, false)) {
    const std::string piece = stream.push(id);
    // Each piece is valid UTF-8 on its own: it never ends inside a multi-byte character.
    EXPECT_EQ(t.decode(t.encode(piece, false)), piece);
    out += piece;
  }
  out += stream.finish();
  EXPECT_EQ(out, text);
  Tokenizer::Stream broken(t);
  EXPECT_EQ(broken.push(0xE6), "");  // first byte of a 3-byte character: held back
  EXPECT_EQ(broken.finish(), "\xEF\xBF\xBD");
}

TEST(Tokenizer, HandMadeBpeAppliesMergesByRank) {
  // Alphabet "a", "b", "c" plus merges "a b" (rank 0) and "ab c" (rank 1).
  const std::string json = R"({
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2, "ab": 3, "abc": 4, "Ġ": 5},
              "merges": ["a b", ["ab", "c"]]},
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false},
    "added_tokens": [{"id": 6, "content": "<eos>", "special": true}]
  })";
  const Tokenizer t = Tokenizer::from_json(json);
  EXPECT_EQ(t.encode("abc"), (std::vector<int32_t>{4}));
  EXPECT_EQ(t.encode("abab c"), (std::vector<int32_t>{3, 3, 5, 2}));
  EXPECT_EQ(t.encode("cab<eos>"), (std::vector<int32_t>{2, 3, 6}));
  EXPECT_EQ(t.decode(std::vector<int32_t>{3, 5, 4}), "ab abc");
  EXPECT_THROW(t.encode("z"), Error);  // no token for the byte
}

TEST(Tokenizer, UnsupportedFormatsAreNamed) {
  const std::string other = R"({"model": {"type": "BPE", "vocab": {}}, "pre_tokenizer": {"type": "Whitespace"}})";
  try {
    Tokenizer::from_json(other);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pre_tokenizer 'Whitespace' is not supported; supported: ByteLevel"),
              std::string::npos) << e.what();
  }
  EXPECT_THROW(Tokenizer::from_json(R"({"model": {"type": "Unigram"}})"), Error);
  EXPECT_THROW(Tokenizer::from_json("{not json"), Error);
}

// GPT-2 style: ByteLevel with its regex splits "Hello world!" into "Hello", " world", "!";
// the space becomes "Ġ" and merges build whole words.
TEST(Tokenizer, ByteLevelWithGpt2Regex) {
  const std::string json = R"({
    "model": {"type": "BPE",
              "vocab": {"H": 0, "e": 1, "l": 2, "o": 3, "Ġ": 4, "w": 5, "r": 6, "d": 7, "!": 8, "1": 9, "2": 10,
                        "He": 11, "ll": 12, "Hell": 13, "Hello": 14, "Ġw": 15, "or": 16, "Ġwor": 17, "Ġworl": 18,
                        "Ġworld": 19, "12": 20},
              "merges": ["H e", "l l", "He ll", "Hell o", "Ġ w", "o r", "Ġw or", "Ġwor l", "Ġworl d", "1 2"]},
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
    "decoder": {"type": "ByteLevel"}
  })";
  const Tokenizer t = Tokenizer::from_json(json);
  EXPECT_EQ(t.encode("Hello world!"), (std::vector<int32_t>{14, 19, 8}));
  // "!" and "12" are separate regex pieces, so "!1" never merges across them.
  EXPECT_EQ(t.encode("Hello!12"), (std::vector<int32_t>{14, 8, 20}));
  EXPECT_EQ(t.decode(std::vector<int32_t>{14, 19, 8}), "Hello world!");
}

// Llama-3 style: a Split regex isolates digit runs of at most three before ByteLevel.
TEST(Tokenizer, SplitRegexIsolatesDigitGroups) {
  const std::string json = R"({
    "model": {"type": "BPE", "vocab": {"1": 0, "2": 1, "3": 2, "4": 3, "5": 4, "12": 5, "123": 6, "45": 7, "a": 8},
              "merges": ["1 2", "12 3", "4 5"]},
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"}, "behavior": "Isolated", "invert": false},
      {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]}
  })";
  const Tokenizer t = Tokenizer::from_json(json);
  EXPECT_EQ(t.encode("12345"), (std::vector<int32_t>{6, 7}));
  EXPECT_EQ(t.encode("a12345a"), (std::vector<int32_t>{8, 6, 7, 8}));
}

// SentencePiece style (Llama-2): "▁" prepended and replacing spaces, BPE over characters,
// unknown characters as <0xXX> byte tokens, the decoder restoring spaces and dropping the first.
TEST(Tokenizer, SentencePieceStyleWithByteFallback) {
  const std::string json = R"({
    "normalizer": {"type": "Sequence", "normalizers": [
      {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
    "pre_tokenizer": null,
    "model": {"type": "BPE", "byte_fallback": true, "unk_token": "<unk>",
              "vocab": {"<unk>": 0, "<s>": 1, "<0x0A>": 2, "<0xC3>": 3, "<0xA9>": 4, "▁": 5, "H": 6, "i": 7,
                        "▁H": 8, "▁Hi": 9, "t": 10, "▁t": 11, "h": 12, "▁th": 13, "e": 14, "▁the": 15},
              "merges": ["▁ H", "▁H i", "▁ t", "▁t h", "▁th e"]},
    "added_tokens": [{"id": 1, "content": "<s>", "special": true}, {"id": 0, "content": "<unk>", "special": true}],
    "post_processor": {"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
      "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
    "decoder": {"type": "Sequence", "decoders": [
      {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"},
      {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
  })";
  const Tokenizer t = Tokenizer::from_json(json);
  // "Hi the\né" -> "▁Hi▁the\né": ▁Hi, ▁the, then \n and é through byte fallback.
  const std::vector<int32_t> ids{1, 9, 15, 2, 3, 4};
  EXPECT_EQ(t.encode("Hi the\n\xC3\xA9"), ids);
  EXPECT_EQ(t.decode(ids), "Hi the\n\xC3\xA9");
  Tokenizer::Stream stream(t);
  std::string streamed;
  for (int32_t id : ids) streamed += stream.push(id);
  EXPECT_EQ(streamed + stream.finish(), "Hi the\n\xC3\xA9");
}

// Invalid UTF-8 decodes as Rust's from_utf8_lossy does (one U+FFFD per maximal invalid subpart),
// and the stream holds back only a tail that more bytes could complete.
TEST(Tokenizer, LossyUtf8LikeHuggingFace) {
  const Tokenizer t = Tokenizer::from_file(kShipped);
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(t.decode(std::vector<int32_t>{0xE6, 0x97, 0x41}), fffd + "A");
  EXPECT_EQ(t.decode(std::vector<int32_t>{0xED, 0xA0, 0x80}), fffd + fffd + fffd);  // a surrogate
  EXPECT_EQ(t.decode(std::vector<int32_t>{0xC0, 0xAF}), fffd + fffd);              // overlong
  EXPECT_EQ(t.decode(std::vector<int32_t>{0xF5, 0x41}), fffd + "A");
  Tokenizer::Stream s(t);
  EXPECT_EQ(s.push(0xE6), "");
  EXPECT_EQ(s.push(0x41), fffd + "A") << "A cannot continue E6: both are final at once";
}

// The encoder agrees with the validating decoder on every scalar value, at each length boundary.
// The lead-byte length is by bit pattern alone: invalid leads C0, C1 and F5..F7 still announce 2
// and 4, which is how SentencePiece-style tokenizers have always grouped such bytes.
TEST(Tokenizer, Utf8EncodeAndSequenceLength) {
  EXPECT_EQ(utf8_encode(0x41), "A");
  EXPECT_EQ(utf8_encode(0x80), "\xC2\x80");
  EXPECT_EQ(utf8_encode(0x7FF), "\xDF\xBF");
  EXPECT_EQ(utf8_encode(0x800), "\xE0\xA0\x80");
  EXPECT_EQ(utf8_encode(0xFFFF), "\xEF\xBF\xBF");
  EXPECT_EQ(utf8_encode(0x10000), "\xF0\x90\x80\x80");
  EXPECT_EQ(utf8_encode(0x10FFFF), "\xF4\x8F\xBF\xBF");
  for (uint32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;  // surrogates are not scalar values
    const std::string bytes = utf8_encode(cp);
    ASSERT_EQ(utf8_lossy(bytes), bytes) << cp;
    ASSERT_EQ(utf8_sequence_length(static_cast<uint8_t>(bytes[0])), bytes.size()) << cp;
  }
  for (int b = 0; b < 256; ++b) {
    const size_t expected = b >= 0xC0 && b <= 0xDF ? 2 : b >= 0xE0 && b <= 0xEF ? 3 : b >= 0xF0 && b <= 0xF7 ? 4 : 1;
    EXPECT_EQ(utf8_sequence_length(static_cast<uint8_t>(b)), expected) << b;
  }
}

const char* kSentencePieceVocab = R"(
    "model": {"type": "BPE", "byte_fallback": true, "unk_token": "<unk>",
              "vocab": {"<unk>": 0, "<s>": 1, "▁": 2, "t": 3, "h": 4, "e": 5, "▁t": 6, "▁th": 7, "▁the": 8,
                        "H": 9, "i": 10, "▁H": 11, "▁Hi": 12, "é": 13, "▁é": 14},
              "merges": ["▁ t", "▁t h", "▁th e", "▁ H", "▁H i", "▁ é"]},
    "added_tokens": [{"id": 1, "content": "<s>", "special": true}, {"id": 0, "content": "<unk>", "special": true}])";

// Llama-2's Prepend("▁") runs before Replace(" " -> "▁") and prepends to any non-empty text,
// so a leading space becomes two marks.
TEST(Tokenizer, PrependNormalizerKeepsLeadingSpaces) {
  const std::string json = std::string(R"({"normalizer": {"type": "Sequence", "normalizers": [
      {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
    "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
      {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},)") +
                           kSentencePieceVocab + "}";
  const Tokenizer t = Tokenizer::from_json(json);
  EXPECT_EQ(t.encode(" the", false), (std::vector<int32_t>{2, 8}));
  EXPECT_EQ(t.encode("the", false), (std::vector<int32_t>{8}));
  EXPECT_EQ(t.decode(std::vector<int32_t>{2, 8}), " the");
  // A stream that continues a prompt keeps the first token's space.
  Tokenizer::Stream continuing(t, true);
  EXPECT_EQ(continuing.push(8), " the");
}

// Metaspace with prepend_scheme "first": only text at the very start of the input gets the mark;
// split divides before every mark.
TEST(Tokenizer, MetaspaceFirstAndSplit) {
  const std::string json = std::string(R"({"pre_tokenizer": {"type": "Metaspace", "replacement": "▁",
      "prepend_scheme": "first", "split": true},
    "decoder": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first"},)") +
                           kSentencePieceVocab + "}";
  const Tokenizer t = Tokenizer::from_json(json);
  EXPECT_EQ(t.encode("Hi the", false), (std::vector<int32_t>{12, 8}));
  EXPECT_EQ(t.encode("<s>Hi", false), (std::vector<int32_t>{1, 9, 10})) << "no mark after an added token";
  EXPECT_EQ(t.decode(std::vector<int32_t>{12, 8}), "Hi the");
}

// Equal ranks merge leftmost first; long pieces (SentencePiece style has no pre-tokenizer split)
// merge correctly.
TEST(Tokenizer, BpeTiesAndLongPieces) {
  const Tokenizer t = Tokenizer::from_json(R"({
    "model": {"type": "BPE", "vocab": {"a": 0, "aa": 1}, "merges": ["a a"]},
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}})");
  EXPECT_EQ(t.encode("aaa"), (std::vector<int32_t>{1, 0}));
  EXPECT_EQ(t.encode("aaaa"), (std::vector<int32_t>{1, 1}));
  const std::string json = std::string(R"({"normalizer": {"type": "Sequence", "normalizers": [
      {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},)") +
                           kSentencePieceVocab + "}";
  const Tokenizer sp = Tokenizer::from_json(json);
  std::string text;
  std::vector<int32_t> want{8};  // "▁the", then "the" without a mark: t, h, e
  for (int i = 0; i < 5000; ++i) {
    text += "the";
    if (i > 0) want.insert(want.end(), {3, 4, 5});
  }
  EXPECT_EQ(sp.encode(text, false), want);
}

// Gemma's Split(" ", MergedWithPrevious) and Qwen2's NFC normalizer.
TEST(Tokenizer, LiteralSplitAndNfc) {
  const std::string gemma = std::string(R"({"normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
    "pre_tokenizer": {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": false},)") +
                            kSentencePieceVocab + "}";
  const Tokenizer g = Tokenizer::from_json(gemma);
  EXPECT_EQ(g.encode("Hi the", false), (std::vector<int32_t>{9, 10, 8}));
  const std::string qwen = R"({"normalizer": {"type": "NFC"},
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false},
    "model": {"type": "BPE", "vocab": {"Ã": 0, "©": 1, "e": 2, "Ì": 3, "ģ": 4, "Ã©": 5}, "merges": ["Ã ©"]}})";
  const Tokenizer q = Tokenizer::from_json(qwen);
  // "e" + combining acute (U+0301, bytes CC 81) composes to "é" (C3 A9) = one merged token.
  EXPECT_EQ(q.encode("e\xCC\x81", false), (std::vector<int32_t>{5}));
}

// Every malformed field is one specula::Error naming the key path and the value: no crash, no
// nlohmann exception, no allocation sized by an unchecked id.
TEST(Tokenizer, HostileFieldsAreNamedErrors) {
  const std::string head = R"({"pre_tokenizer": {"type": "ByteLevel", "use_regex": false},
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []})";
  EXPECT_EQ(Tokenizer::from_json(head + R"(, "added_tokens": [{"id": 2, "content": "<s>", "special": true}]})").vocab_size(), 3);
  const std::pair<std::string, std::string> cases[] = {
      {R"(, "added_tokens": [{"id": -1, "content": "<s>"}]})", "'added_tokens[0].id' = -1 is out of range [0, 2]"},
      {R"(, "added_tokens": [{"id": 4294967295, "content": "<s>"}]})", "'added_tokens[0].id' = 4294967295 is out of range"},
      {R"(, "added_tokens": [{"content": "<s>"}]})", "'added_tokens[0].id' is missing"},
      {R"(, "added_tokens": [{"id": 2}]})", "'added_tokens[0].content' is missing"},
      {R"(, "added_tokens": [{"id": "2", "content": "<s>"}]})", "'added_tokens[0].id' must be an integer"},
      {R"(, "added_tokens": {"id": 2}})", "'added_tokens' must be an array"},
      {R"(, "post_processor": {"type": "TemplateProcessing"}})", "'post_processor.single' is missing"},
      {R"(, "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}}],
           "special_tokens": {"<s>": {"ids": [99]}}}})", "'post_processor.special_tokens.<s>.ids[0]' = 99 is out of range"},
      {R"(, "decoder": {"type": "Strip", "start": "x"}})", "'decoder.start' must be an integer"},
      {R"(, "x": 1e309})", "number overflow"},
  };
  for (const auto& [tail, message] : cases) {
    const std::string text = head + tail;
    std::string error = "(no error)";
    try {
      Tokenizer::from_json(text);
    } catch (const Error& e) {
      error = e.what();
    }
    EXPECT_NE(error.find(message), std::string::npos) << text << "\n -> " << error;
    EXPECT_EQ(error.find("json.exception"), std::string::npos) << error;
  }
  const std::pair<std::string, std::string> model_cases[] = {
      {R"({"type": "BPE", "vocab": {"a": 4611686018427387904}})", "'model.vocab.a' = 4611686018427387904 is out of range [0, 0]"},
      {R"({"type": "BPE", "vocab": {"a": 0}, "merges": [["a"]]})", "'model.merges[0]' must be 'a b' or [a, b]"},
      {R"({"type": "BPE", "vocab": {"a": 0}, "byte_fallback": 1})", "'model.byte_fallback' must be true or false"},
      {R"({"type": "BPE", "vocab": [1]})", "'model.vocab' must be an object"},
      {R"({"type": 5})", "'model.type' must be a string"},
  };
  for (const auto& [model, message] : model_cases) {
    const std::string text = R"({"pre_tokenizer": {"type": "ByteLevel"}, "model": )" + model + "}";
    std::string error = "(no error)";
    try {
      Tokenizer::from_json(text);
    } catch (const Error& e) {
      error = e.what();
    }
    EXPECT_NE(error.find(message), std::string::npos) << text << "\n -> " << error;
  }
}

// tokenizer_config.json's add_bos_token, for the classes whose transformers tokenizer honours it:
// a Llama tokenizer without a template post-processor (DeepSeek-V3's case) gets the BOS.
TEST(Tokenizer, AddBosTokenFromTokenizerConfig) {
  const auto dir = std::filesystem::temp_directory_path() / ("specula_tok_" + std::to_string(std::random_device{}()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << R"({"pre_tokenizer": {"type": "ByteLevel", "use_regex": false},
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "<s>": 2}, "merges": []},
    "added_tokens": [{"id": 2, "content": "<s>", "special": true}]})";
  EXPECT_EQ(Tokenizer::from_folder(dir).encode("ab"), (std::vector<int32_t>{0, 1}));
  std::ofstream(dir / "tokenizer_config.json")
      << R"({"tokenizer_class": "LlamaTokenizerFast", "add_bos_token": true, "bos_token": {"content": "<s>"}})";
  EXPECT_EQ(Tokenizer::from_folder(dir).encode("ab"), (std::vector<int32_t>{2, 0, 1}));
  EXPECT_EQ(Tokenizer::from_folder(dir).encode("ab", false), (std::vector<int32_t>{0, 1}));
  // PreTrainedTokenizerFast keeps tokenizer.json's post-processor, as transformers does.
  std::ofstream(dir / "tokenizer_config.json")
      << R"({"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": true, "bos_token": "<s>"})";
  EXPECT_EQ(Tokenizer::from_folder(dir).encode("ab"), (std::vector<int32_t>{0, 1}));
  std::ofstream(dir / "tokenizer_config.json")
      << R"({"tokenizer_class": "LlamaTokenizer", "add_bos_token": true, "bos_token": "<missing>"})";
  EXPECT_THROW(Tokenizer::from_folder(dir), Error);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace specula
