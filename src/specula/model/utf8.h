// UTF-8 helpers for tokenizers: lossy decoding with Rust's / WHATWG's replacement rule (one
// U+FFFD per maximal invalid subpart, as Hugging Face's decoders produce), how much of a byte
// stream is final, and Unicode NFC normalisation (through utf8proc where available).
#pragma once

#include <string>
#include <string_view>

namespace specula {

// Valid UTF-8 with every invalid subpart replaced by U+FFFD.
std::string utf8_lossy(std::string_view bytes);
// Length of the prefix of `bytes` that can be decoded now: everything except a trailing
// sequence that is valid so far but incomplete (more bytes could still complete it).
size_t utf8_final_prefix(std::string_view bytes);
// NFC; throws specula::Error in builds without utf8proc.
std::string utf8_nfc(std::string_view text);

}  // namespace specula
