// Fuzzes the server's request-body parsers (/v1/completions, /v1/chat/completions, /tokenize,
// /detokenize) on arbitrary bytes; the first byte picks the parser. An HttpError (the 4xx a client
// gets) or a specula::Error is the expected answer to bad input; anything else is a finding.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_common.h"
#include "specula/server/openai_request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  specula::fuzz::guarded([&] {
    using namespace specula::server;
    try {
      switch (data[0] % 4) {
        case 0: {
          const GenerationRequest g = parse_completion_request(body);
          volatile size_t sink = g.prompt_texts.size() + g.prompt_ids.size() + g.stop.size();
          (void)sink;
          break;
        }
        case 1: {
          const GenerationRequest g = parse_chat_request(body);
          volatile size_t sink = g.messages.dump().size() + g.template_kwargs.dump().size();
          (void)sink;
          break;
        }
        case 2: {
          const TokenizeRequest t = parse_tokenize_request(body);
          volatile size_t sink = t.messages.dump().size() + (t.prompt ? t.prompt->size() : 0);
          (void)sink;
          break;
        }
        default: {
          volatile size_t sink = parse_detokenize_request(body).size();
          (void)sink;
        }
      }
    } catch (const HttpError& e) {
      // A client error: its status must be one the server answers with.
      if (e.status < 400 || e.status > 599) __builtin_trap();
    }
  });
  return 0;
}
