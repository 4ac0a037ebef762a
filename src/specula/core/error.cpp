// Out-of-line failure paths for SPECULA_CHECK / SPECULA_ASSERT, so the macros stay small at
// every call site.
#include "specula/core/error.h"

#include <string>
#include <cstdio>
#include <cstdlib>

namespace specula::detail {

void throw_check_failure(const char* /*file*/, int /*line*/, const std::string& message) {
  // The message is for the user: it names the value and what is allowed, without source paths.
  throw Error(message);
}

void assert_failure(const char* file, int line, const char* condition, const std::string& message) {
  std::fprintf(stderr, "specula internal error at %s:%d: assertion `%s` failed%s%s\n", file, line,
               condition, message.empty() ? "" : ": ", message.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace specula::detail
