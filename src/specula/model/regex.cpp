// Regex over PCRE2 (UTF + UCP, so \s, \w and \d follow Unicode as the tokenizers' Rust regex
// crate does), JIT-compiled when available.
#include "specula/model/regex.h"

#include "specula/core/error.h"

#ifdef SPECULA_HAS_PCRE2
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#endif

namespace specula {

#ifdef SPECULA_HAS_PCRE2
struct Regex::Impl {
  pcre2_code* code = nullptr;
  ~Impl() {
    if (code != nullptr) pcre2_code_free(code);
  }
};

Regex::Regex(const std::string& pattern) : impl_(std::make_unique<Impl>()) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                              &error, &offset, nullptr);
  if (impl_->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    SPECULA_CHECK(false, "tokenizer regex '{}' does not compile at offset {}: {}", pattern, offset,
                  reinterpret_cast<char*>(message));
  }
  pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE);  // optional speed-up; matching works without it
}

Regex::~Regex() = default;

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> out;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(impl_->code, nullptr);
  size_t start = 0;
  while (start <= text.size()) {
    const int rc = pcre2_match(impl_->code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), start, 0, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      pcre2_match_data_free(md);
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      // Invalid UTF-8 input is the usual cause: the tokenizer should not silently mis-split.
      SPECULA_CHECK(false, "tokenizer regex match failed at byte {}: {}", start, reinterpret_cast<char*>(message));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t b = ov[0], e = ov[1];
    if (e > b) out.emplace_back(b, e);
    // An empty match advances by one character (not byte) to stay on UTF-8 boundaries.
    size_t next = e > b ? e : e + 1;
    while (next < text.size() && (static_cast<unsigned char>(text[next]) & 0xC0) == 0x80) ++next;
    start = next;
  }
  pcre2_match_data_free(md);
  return out;
}
#else
struct Regex::Impl {};
Regex::Regex(const std::string& pattern) {
  SPECULA_CHECK(false, "tokenizer regex '{}' needs PCRE2, which this build lacks (install libpcre2-dev and rebuild)",
                pattern);
}
Regex::~Regex() = default;
std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view) const { return {}; }
#endif

}  // namespace specula
