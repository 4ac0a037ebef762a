#include "specula/attention/cuda/kernels/tensor_map.h"

#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <string>

#include "specula/core/cuda_check.h"

namespace specula::cuda_kernels {

CUtensorMap swizzled_tensor_map(const void* base, bool bf16, int rank, const uint64_t* dims, const uint64_t* strides,
                                const uint32_t* box, const char* what) {
  // The encoder comes through the runtime's driver entry point, so libcuda is not linked.
  static const auto encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
    SPECULA_REQUIRE(found == cudaDriverEntryPointSuccess && fn != nullptr,
                    "the driver has no cuTensorMapEncodeTiled (TMA needs CUDA 12 or newer)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  SPECULA_REQUIRE(rank >= 1 && rank <= 5 && box[0] == 64, std::string("tensor map of ") + what +
                                                              ": rank 1..5 with 64-element boxes");
  cuuint64_t d[5];
  cuuint64_t s[4];
  cuuint32_t b[5];
  cuuint32_t element_strides[5];
  for (int i = 0; i < rank; ++i) {
    d[i] = dims[i];
    b[i] = box[i];
    element_strides[i] = 1;
    if (i > 0) s[i - 1] = strides[i - 1];
  }
  CUtensorMap map{};
  const CUresult r = encode(&map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                            static_cast<cuuint32_t>(rank), const_cast<void*>(base), d, s, b, element_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  SPECULA_REQUIRE(r == CUDA_SUCCESS, std::string("encoding the tensor map of ") + what + " failed (CUresult " +
                                         std::to_string(r) + ", outermost extent " + std::to_string(dims[rank - 1]) +
                                         ")");
  return map;
}

}  // namespace specula::cuda_kernels
