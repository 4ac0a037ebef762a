// OutputText implementation.
#include "specula/runtime/output_text.h"

#include <algorithm>

#include "specula/core/error.h"

namespace specula {

OutputText::OutputText(const Tokenizer* tokenizer, std::vector<std::string> stop_strings)
    : stop_strings_(std::move(stop_strings)) {
  for (const std::string& s : stop_strings_) {
    SPECULA_CHECK(!s.empty(), "stop strings must not be empty");
    longest_stop_ = std::max(longest_stop_, s.size());
  }
  SPECULA_CHECK(tokenizer != nullptr || stop_strings_.empty(), "stop strings need a tokenizer");
  // The output continues the prompt, so the decoder's "strip the first space" rule is off.
  if (tokenizer != nullptr) stream_.emplace(*tokenizer, /*continuing=*/true);
}

bool OutputText::find_stop(size_t before) {
  if (longest_stop_ == 0) return false;
  // A stop string that ends after `before` starts at most longest_stop_ bytes earlier.
  const size_t from = before > longest_stop_ ? before - longest_stop_ : 0;
  size_t cut = std::string::npos;
  for (const std::string& s : stop_strings_) cut = std::min(cut, text_.find(s, from));
  if (cut == std::string::npos) return false;
  text_.resize(cut);
  stopped_ = true;
  return true;
}

bool OutputText::push(int32_t token) {
  SPECULA_ASSERT(!stopped_ && !finished_);
  const size_t before = text_.size();
  if (stream_) text_ += stream_->push(token);
  return find_stop(before);
}

bool OutputText::finish() {
  if (stopped_ || finished_) return stopped_;
  finished_ = true;
  const size_t before = text_.size();
  if (stream_) text_ += stream_->finish();
  return find_stop(before);
}

std::string_view OutputText::take_final() {
  size_t safe = text_.size();
  if (!stopped_ && !finished_ && longest_stop_ > 1) {
    safe = text_.size() > longest_stop_ - 1 ? text_.size() - (longest_stop_ - 1) : 0;
    while (safe > taken_ && safe < text_.size() && (static_cast<unsigned char>(text_[safe]) & 0xC0) == 0x80) --safe;
  }
  if (safe <= taken_) return {};
  const std::string_view out = std::string_view(text_).substr(taken_, safe - taken_);
  taken_ = safe;
  return out;
}

}  // namespace specula
