// Fuzzes specula::Tokenizer::from_json (tokenizer.json) on arbitrary bytes. When a tokenizer
// loads, its tables are exercised: a short fixed text is encoded (with and without special
// tokens) and decoded, and a few arbitrary ids (negative, past the vocabulary, huge) are decoded
// and streamed. A specula::Error is the expected answer to bad input; anything else is a finding.
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "specula/model/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  specula::fuzz::guarded([&] {
    const specula::Tokenizer t = specula::Tokenizer::from_json(text);
    volatile size_t sink = 0;
    // Encoding may refuse text the vocabulary cannot cover (no unk/byte fallback): an Error.
    specula::fuzz::guarded([&] {
      const std::vector<int32_t> ids = t.encode("Hello world! 123 h\xC3\xA9llo \xE6\x97\xA5 <s>\n", true);
      sink = sink + t.decode(ids).size() + t.decode(ids, false).size() + t.encode("ab  c", false).size();
    });
    const int32_t v = t.vocab_size();
    const std::vector<int32_t> odd{0, 1, -1, v - 1, v, v + 1, 255, 256, std::numeric_limits<int32_t>::max(),
                                   std::numeric_limits<int32_t>::min()};
    specula::fuzz::guarded([&] {
      sink = sink + t.decode(odd).size() + t.decode(odd, false).size();
      specula::Tokenizer::Stream stream(t);
      for (int32_t id : odd) sink = sink + stream.push(id).size() + (t.is_special(id) ? 1 : 0);
      sink = sink + stream.finish().size();
    });
    (void)sink;
  });
  return 0;
}
