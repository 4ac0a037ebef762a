// `specula bench attention --mla`: times the CUDA MLA backend on DeepSeek shapes (dense decode
// and MTP over a bf16 latent cache, sparse top-k decode over the fp8_ds_mla cache, the lightning
// indexer) next to the device's copy and GEMM ceilings measured in the same run.
#pragma once

#include <string>

namespace specula {

struct MlaBenchOptions {
  std::string device = "cuda";
  std::string json_path;
  std::string filter;
  std::string l2 = "cold";  // the L2 at each timed call's start: cold, dirty or warm
};

int run_mla_bench(const MlaBenchOptions& options);

}  // namespace specula
