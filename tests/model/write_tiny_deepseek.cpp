// Writes a tiny random DeepSeek-V3-shaped checkpoint (q_lora, YaRN, kv_lora_rank 512, rope 64:
// the shape both MLA backends serve) into the folder given as the only argument, for the CLI test.
#include <cstdio>

#include "tiny_deepseek.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: write_tiny_deepseek DIR\n");
    return 2;
  }
  specula::test::DeepseekShape shape;
  shape.arch = "DeepseekV3ForCausalLM";
  shape.heads = 16;
  shape.q_lora = 64;
  shape.kv_lora = 512;
  shape.rope = 64;
  shape.yarn = true;
  const auto model = specula::test::make_tiny_deepseek(shape, 1234);
  specula::test::write_tiny_checkpoint(argv[1], specula::test::deepseek_config(shape), model.weights);
  return 0;
}
