// Device: where a tensor lives ("cpu" or "cuda:N").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace specula {

enum class DeviceKind : uint8_t { cpu, cuda };

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;  // the CUDA ordinal; 0 for the CPU

  static Device cpu() { return {DeviceKind::cpu, 0}; }
  static Device cuda(int index = 0) { return {DeviceKind::cuda, index}; }
  bool is_cpu() const { return kind == DeviceKind::cpu; }
  bool is_cuda() const { return kind == DeviceKind::cuda; }
  bool operator==(const Device&) const = default;
  std::string str() const;  // "cpu", "cuda:0"
};

// Parses "cpu", "cuda" (= cuda:0) and "cuda:N"; throws specula::Error on anything else.
Device parse_device(std::string_view text);

// True when this build has CUDA and at least one device is visible.
bool cuda_available();

}  // namespace specula
