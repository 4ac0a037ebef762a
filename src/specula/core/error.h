// Errors, the three kinds of ARCHITECTURE.md: SPECULA_CHECK for bad input (throws specula::Error
// with the offending values), SPECULA_ASSERT for invariants (a failure is a bug in specula).
// CUDA_CHECK lives in core/cuda_check.h so host-only code never sees CUDA headers.
#pragma once

#include <fmt/format.h>

#include <string>

#include "specula/core/error_base.h"

namespace specula::detail {
inline std::string format_message() { return {}; }
template <typename... Args>
std::string format_message(fmt::format_string<Args...> format, Args&&... args) {
  return fmt::format(format, std::forward<Args>(args)...);
}
}  // namespace specula::detail

// SPECULA_CHECK(cond, "head_dim {} is not supported; supported: {}", head_dim, list)
#define SPECULA_CHECK(cond, ...)                                                               \
  do {                                                                                         \
    if (!(cond)) [[unlikely]] {                                                                \
      ::specula::detail::throw_check_failure(__FILE__, __LINE__,                               \
                                             ::specula::detail::format_message(__VA_ARGS__)); \
    }                                                                                          \
  } while (0)

// SPECULA_ASSERT(cond) or SPECULA_ASSERT(cond, "fmt", args...): an internal invariant. It is
// kept in release builds because a silently wrong attention result is worse than a stop.
#define SPECULA_ASSERT(cond, ...)                                                          \
  do {                                                                                     \
    if (!(cond)) [[unlikely]] {                                                            \
      ::specula::detail::assert_failure(__FILE__, __LINE__, #cond,                         \
                                        ::specula::detail::format_message(__VA_ARGS__));   \
    }                                                                                      \
  } while (0)
