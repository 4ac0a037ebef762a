// UTF-8 helpers for tokenizers, the only UTF-8 code they use: encoding, lossy decoding with
// Rust's / WHATWG's replacement rule (one U+FFFD per maximal invalid subpart, as Hugging Face's
// decoders produce), how much of a byte stream is final, and Unicode NFC normalisation (through
// utf8proc where available).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace specula {

// The UTF-8 bytes of a code point (at most U+10FFFF).
std::string utf8_encode(uint32_t code_point);
// The sequence length that a lead byte's high bits announce: 2, 3 or 4 for 110xxxxx, 1110xxxx
// and 11110xxx, and 1 for ASCII, a stray continuation byte or F8..FF. It does not check the
// sequence (C0, C1 and F5..F7 announce 2 and 4 though never valid), so splitting text into
// characters with it keeps invalid bytes grouped as the tokenizer always has; utf8_lossy and
// utf8_final_prefix are the validating decoders.
size_t utf8_sequence_length(uint8_t lead);
// Valid UTF-8 with every invalid subpart replaced by U+FFFD.
std::string utf8_lossy(std::string_view bytes);
// Length of the prefix of `bytes` that can be decoded now: everything except a trailing
// sequence that is valid so far but incomplete (more bytes could still complete it).
size_t utf8_final_prefix(std::string_view bytes);
// NFC; throws specula::Error in builds without utf8proc.
std::string utf8_nfc(std::string_view text);

}  // namespace specula
