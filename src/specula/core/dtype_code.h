// Host side of the kernels' element-type codes: DType -> DTypeCode (the same values, checked at
// compile time), -1 for types no kernel reads or writes.
#pragma once

#include <cstdint>

#include "specula/core/dtype_codes.h"
#include "specula/core/dtype.h"

namespace specula {

static_assert(static_cast<int32_t>(DType::f32) == cuda_kernels::kF32 &&
              static_cast<int32_t>(DType::f16) == cuda_kernels::kF16 &&
              static_cast<int32_t>(DType::bf16) == cuda_kernels::kBF16 &&
              static_cast<int32_t>(DType::fp8_e4m3) == cuda_kernels::kFp8E4m3);

inline int32_t kernel_dtype_code(DType d) {
  return static_cast<int32_t>(d) <= cuda_kernels::kFp8E4m3 ? static_cast<int32_t>(d) : -1;
}

}  // namespace specula
