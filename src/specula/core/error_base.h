// specula::Error and the out-of-line failure paths behind SPECULA_CHECK / SPECULA_ASSERT,
// without fmt, so CUDA sources (which cannot compile fmt's constexpr format checks) can throw
// the same errors with std::string messages.
#pragma once

#include <stdexcept>
#include <string>

namespace specula {

// Thrown for bad input or an unsupported request; what() is one line naming the value and what
// is allowed.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

namespace detail {
[[noreturn]] void throw_check_failure(const char* file, int line, const std::string& message);
[[noreturn]] void assert_failure(const char* file, int line, const char* condition, const std::string& message);
}  // namespace detail

}  // namespace specula

// For CUDA sources: SPECULA_REQUIRE(cond, std::string message).
#define SPECULA_REQUIRE(cond, message)                                         \
  do {                                                                         \
    if (!(cond)) [[unlikely]] {                                                \
      ::specula::detail::throw_check_failure(__FILE__, __LINE__, (message));   \
    }                                                                          \
  } while (0)
