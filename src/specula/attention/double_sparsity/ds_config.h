// Double sparsity's settings (SGLang's --ds-* flags) and its channel config: per layer and KV
// head, the key channels whose values stand in for the whole key when the decode picks the
// tokens to attend to ("label channels", found offline from calibration activations by
// tools/ds_channel_config.py).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace specula {

struct DoubleSparsityConfig {
  int heavy_channel_num = 32;          // label channels per KV head
  int heavy_token_num = 256;           // tokens each KV head of a request attends to
  int sparse_decode_threshold = 4096;  // requests with a shorter context attend to every token
  // channels[layer][kv_head * heavy_channel_num + c]: the c-th label channel of that head.
  std::vector<std::vector<int32_t>> channels;

  int num_layers() const { return static_cast<int>(channels.size()); }
};

// The engine's switches (SGLang's --enable-double-sparsity and --ds-* flags and defaults).
struct DoubleSparsityOptions {
  bool enabled = false;
  std::filesystem::path channel_config_path;
  int heavy_channel_num = 32;
  int heavy_token_num = 256;
  int sparse_decode_threshold = 4096;
  std::string heavy_channel_type = "qk";  // which ranking of the file: q, k or qk
};

// Reads the channel config JSON (SGLang's keys: "model.layers.<i>.self_attn.<type>_proj" -> a
// list of num_kv_heads lists (one per KV head) of channel indices, most important first, for heavy_channel_type
// q, k or qk; other keys are ignored) and keeps each head's first heavy_channel_num channels. Throws specula::Error naming the file, the
// key and the value for a missing file, layer or head, a short list, an index outside
// [0, head_dim), a repeated index, or settings out of range.
// The same from the file's text; `file` names it in errors.
DoubleSparsityConfig parse_double_sparsity_config(std::string_view text, const std::string& file, int num_layers,
                                                  int num_kv_heads, int head_dim, int heavy_channel_num,
                                                  int heavy_token_num, int sparse_decode_threshold,
                                                  const std::string& heavy_channel_type = "qk");
DoubleSparsityConfig load_double_sparsity_config(const std::filesystem::path& path, int num_layers, int num_kv_heads,
                                                 int head_dim, int heavy_channel_num, int heavy_token_num,
                                                 int sparse_decode_threshold,
                                                 const std::string& heavy_channel_type = "qk");

}  // namespace specula
