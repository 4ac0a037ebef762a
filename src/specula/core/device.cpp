// Device naming and parsing.
#include "specula/core/device.h"

#include <string>
#include <charconv>

#include "specula/core/error.h"

namespace specula {

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : fmt::format("cuda:{}", index);
}

Device parse_device(std::string_view text) {
  if (text == "cpu") return Device::cpu();
  if (text == "cuda") return Device::cuda(0);
  if (text.starts_with("cuda:")) {
    const std::string_view digits = text.substr(5);
    int index = -1;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (ec == std::errc() && end == digits.data() + digits.size() && index >= 0) {
      return Device::cuda(index);
    }
  }
  SPECULA_CHECK(false, "device '{}' is not valid; expected cpu, cuda or cuda:N", text);
  return Device::cpu();
}

}  // namespace specula
