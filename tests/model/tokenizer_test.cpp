// Tokenizer: the shipped byte-level tokenizer (ids = <s> then the UTF-8 bytes), round trips over
// Unicode, digits and whitespace runs, special tokens in text, streaming that never splits a
// UTF-8 sequence, a hand-made BPE with merges, and clear refusals.
#include <gtest/gtest.h>

#include "specula/core/error.h"
#include "specula/model/tokenizer.h"

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
  EXPECT_THROW(t.decode(std::vector<int32_t>{300}), Error);
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
  const std::string regex = R"({"model": {"type": "BPE", "vocab": {}}, "pre_tokenizer": {"type": "Split"}})";
  try {
    Tokenizer::from_json(regex);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not supported yet; supported: ByteLevel"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Tokenizer::from_json(R"({"model": {"type": "Unigram"}})"), Error);
  EXPECT_THROW(Tokenizer::from_json("{not json"), Error);
}

}  // namespace
}  // namespace specula
