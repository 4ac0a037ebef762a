// OutputText: a request's output text as its tokens arrive. Decodes incrementally (complete UTF-8
// only), cuts the text before the first stop string, and tells which part is final: a tail that
// could still turn out to begin a stop string is held back from streaming.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "specula/model/tokenizer.h"

namespace specula {

class OutputText {
 public:
  // Without a tokenizer the text stays empty and stop strings are refused. Throws specula::Error
  // for an empty stop string.
  OutputText(const Tokenizer* tokenizer, std::vector<std::string> stop_strings);

  // Appends a token's text; true when a stop string now appears (the text ends before it).
  bool push(int32_t token);
  // Generation ended (not by a stop string): bytes still held (an incomplete character) become
  // text; true if a stop string appears in them.
  bool finish();

  const std::string& text() const { return text_; }
  bool stopped() const { return stopped_; }
  // The final text not yet taken: all of it once stopped or finished, otherwise all but the last
  // (longest stop string - 1) bytes, backed up to a UTF-8 character boundary.
  std::string_view take_final();

 private:
  bool find_stop(size_t before);

  std::optional<Tokenizer::Stream> stream_;
  std::vector<std::string> stop_strings_;
  size_t longest_stop_ = 0;
  std::string text_;
  size_t taken_ = 0;
  bool stopped_ = false;
  bool finished_ = false;
};

}  // namespace specula
