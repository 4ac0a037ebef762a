// Fuzzes encoding and decoding with real tokenizers, loaded once (LLVMFuzzerInitialize): the shipped byte-level
// models/specula-byte-6m/tokenizer.json and the hand-made fixtures of tests/model/tokenizer_test.cpp
// (SentencePiece style with byte fallback, Metaspace, GPT-2 regex, Llama-3 Split regex, Gemma
// literal Split, Qwen2 NFC), kept as fuzz/corpus/fuzz_tokenizer_load/tok-*.json. For each
// tokenizer the input is encoded with and without special tokens, the ids decoded (with and
// without skipping specials), the raw input read as little-endian int32 ids (any value) and
// decoded, and both id lists pushed through a Tokenizer::Stream. A specula::Error is the
// expected answer (e.g. a character the vocabulary cannot cover); anything else is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_common.h"
#include "specula/model/tokenizer.h"

namespace {

std::vector<specula::Tokenizer>* g_tokenizers = nullptr;

void load_tokenizers() {
  const std::filesystem::path root(SPECULA_SOURCE_DIR);
  const std::filesystem::path fixtures = root / "fuzz/corpus/fuzz_tokenizer_load";
  g_tokenizers = new std::vector<specula::Tokenizer>;  // lives for the whole run
  for (const std::filesystem::path& path :
       {root / "models/specula-byte-6m/tokenizer.json", fixtures / "tok-sentencepiece.json",
        fixtures / "tok-metaspace.json", fixtures / "tok-gpt2-regex.json", fixtures / "tok-llama3-split.json",
        fixtures / "tok-gemma-split.json", fixtures / "tok-qwen-nfc.json"}) {
    try {
      g_tokenizers->push_back(specula::Tokenizer::from_file(path));
    } catch (const std::exception& e) {
      // Only a build without the optional PCRE2 / utf8proc may skip a fixture; any other
      // refusal means the tokenizer no longer loads what its unit tests load: stop here, before
      // any input (so no input is blamed).
      const std::string what = e.what();
      if (what.find("PCRE2") != std::string::npos || what.find("utf8proc") != std::string::npos) {
        std::fprintf(stderr, "fuzz_tokenizer_text: skipping %s: %s\n", path.c_str(), e.what());
        continue;
      }
      std::fprintf(stderr, "fuzz_tokenizer_text: fixture %s does not load: %s\n", path.c_str(), e.what());
      std::abort();
    }
  }
  std::fprintf(stderr, "fuzz_tokenizer_text: %zu tokenizers loaded\n", g_tokenizers->size());
}

void stream_all(const specula::Tokenizer& t, const std::vector<int32_t>& ids, bool continuing) {
  specula::Tokenizer::Stream stream(t, continuing);
  volatile size_t sink = 0;
  for (int32_t id : ids) sink = sink + stream.push(id).size();
  sink = sink + stream.finish().size();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  load_tokenizers();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<int32_t> raw_ids(size / 4);
  if (!raw_ids.empty()) std::memcpy(raw_ids.data(), data, raw_ids.size() * 4);  // little-endian host
  for (const specula::Tokenizer& t : *g_tokenizers) {
    specula::fuzz::guarded([&] {
      for (bool special : {true, false}) {
        const std::vector<int32_t> ids = t.encode(text, special);
        volatile size_t sink = t.decode(ids).size() + t.decode(ids, false).size();
        (void)sink;
        stream_all(t, ids, !special);
      }
    });
    specula::fuzz::guarded([&] {
      volatile size_t sink = t.decode(raw_ids).size() + t.decode(raw_ids, false).size();
      (void)sink;
      stream_all(t, raw_ids, false);
    });
  }
  return 0;
}
