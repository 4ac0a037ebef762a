// Element-type codes that kernels see (plain ints in Params structs: kernels know no engine
// types). The values match specula::DType.
#pragma once

#include <cstdint>

namespace specula::cuda_kernels {

enum DTypeCode : int32_t { kF32 = 0, kF16 = 1, kBF16 = 2, kFp8E4m3 = 3 };

}  // namespace specula::cuda_kernels
