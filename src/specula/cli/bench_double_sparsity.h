// `specula bench attention --double-sparsity`: dense decode and double-sparsity decode of the same
// paged cache side by side (CUDA), with the device's copy ceiling measured in the same run.
#pragma once

#include <string>

namespace specula {

struct DsBenchOptions {
  std::string device = "cuda";
  std::string json_path;
  std::string filter;
  std::string l2 = "cold";
  int heavy_channel_num = 16;
  int token_fraction = 16;  // heavy_token_num = context / token_fraction
};

int run_ds_bench(const DsBenchOptions& options);

}  // namespace specula
