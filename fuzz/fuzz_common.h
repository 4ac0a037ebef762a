// Shared by the fuzz targets: the one policy for exceptions. specula::Error is the parsers'
// documented answer to bad input and is ignored; any other exception escaping a parser
// (nlohmann::json::exception, std::bad_alloc, std::length_error, std::out_of_range, ...) is a
// bug, reported by aborting so libFuzzer saves the input.
//
// FUZZ_IGNORE="text1|text2" (environment) treats an unexpected exception whose what() contains
// one of the texts as expected, so a triage run can look past a finding already known.
#pragma once

#include <cxxabi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>
#include <typeinfo>

#include "specula/core/error_base.h"

namespace specula::fuzz {

inline bool ignored(std::string_view what) {
  static const std::string list = std::getenv("FUZZ_IGNORE") != nullptr ? std::getenv("FUZZ_IGNORE") : "";
  for (size_t begin = 0; begin < list.size();) {
    const size_t end = std::min(list.find('|', begin), list.size());
    if (end > begin && what.find(std::string_view(list).substr(begin, end - begin)) != std::string_view::npos) return true;
    begin = end + 1;
  }
  return false;
}

inline void unexpected_exception(const char* type, const char* what) {
  if (ignored(what)) return;
  int status = 0;
  char* name = abi::__cxa_demangle(type, nullptr, nullptr, &status);
  std::fprintf(stderr, "fuzz: unexpected exception %s escaped: %s\n", name != nullptr ? name : type, what);
  std::fflush(stderr);
  std::abort();
}

// Runs body(); returns false if it threw specula::Error (or an ignored exception), aborts on
// any other exception.
template <typename F>
bool guarded(F&& body) {
  try {
    body();
    return true;
  } catch (const specula::Error&) {
    return false;
  } catch (const std::exception& e) {
    unexpected_exception(typeid(e).name(), e.what());
  } catch (...) {
    unexpected_exception("(not a std::exception)", "");
  }
  return false;
}

}  // namespace specula::fuzz
