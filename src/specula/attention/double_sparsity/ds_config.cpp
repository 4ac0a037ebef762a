#include "specula/attention/double_sparsity/ds_config.h"

#include <fmt/format.h>

#include <set>
#include <string>

#include "specula/core/error.h"
#include "specula/core/json_reader.h"

namespace specula {

DoubleSparsityConfig load_double_sparsity_config(const std::filesystem::path& path, int num_layers, int num_kv_heads,
                                                 int head_dim, int heavy_channel_num, int heavy_token_num,
                                                 int sparse_decode_threshold, const std::string& heavy_channel_type) {
  SPECULA_CHECK(!path.empty(), "double sparsity needs --ds-channel-config-path (make one with tools/ds_channel_config.py)");
  SPECULA_CHECK(std::filesystem::is_regular_file(path), "--ds-channel-config-path {}: no such file", path.string());
  return parse_double_sparsity_config(read_text_file(path), path.string(), num_layers, num_kv_heads, head_dim,
                                      heavy_channel_num, heavy_token_num, sparse_decode_threshold, heavy_channel_type);
}

DoubleSparsityConfig parse_double_sparsity_config(std::string_view text, const std::string& file, int num_layers,
                                                  int num_kv_heads, int head_dim, int heavy_channel_num,
                                                  int heavy_token_num, int sparse_decode_threshold,
                                                  const std::string& heavy_channel_type) {
  SPECULA_CHECK(heavy_channel_type == "q" || heavy_channel_type == "k" || heavy_channel_type == "qk",
                "--ds-heavy-channel-type {} is not known; allowed q, k, qk", heavy_channel_type);
  SPECULA_CHECK(heavy_channel_num >= 1 && heavy_channel_num <= head_dim,
                "--ds-heavy-channel-num {} is out of range; allowed 1 to head_dim ({})", heavy_channel_num, head_dim);
  SPECULA_CHECK(heavy_token_num >= 1, "--ds-heavy-token-num {} is out of range; it must be >= 1", heavy_token_num);
  SPECULA_CHECK(sparse_decode_threshold >= 1, "--ds-sparse-decode-threshold {} is out of range; it must be >= 1",
                sparse_decode_threshold);
  const JsonReader::json document = JsonReader::parse(text, file);
  const JsonReader root(document, file);
  SPECULA_CHECK(root.is_object(), "{}: expected an object of \"model.layers.<i>.self_attn.<type>_proj\" entries", file);

  DoubleSparsityConfig config;
  config.heavy_channel_num = heavy_channel_num;
  config.heavy_token_num = heavy_token_num;
  config.sparse_decode_threshold = sparse_decode_threshold;
  for (int layer = 0; layer < num_layers; ++layer) {
    const std::string key = fmt::format("model.layers.{}.self_attn.{}_proj", layer, heavy_channel_type);
    SPECULA_CHECK(root.has(key), "{}: no \"{}\"; the model has {} layers", file, key, num_layers);
    const JsonReader heads = root.at(key);
    if (!heads.is_array() || heads.size() != static_cast<size_t>(num_kv_heads)) {
      heads.fail(fmt::format("must list {} heads (one per KV head)", num_kv_heads));
    }
    std::vector<int32_t>& out = config.channels.emplace_back();
    for (size_t h = 0; h < heads.size(); ++h) {
      const JsonReader row = heads[h];
      if (!row.is_array() || row.size() < static_cast<size_t>(heavy_channel_num)) {
        row.fail(fmt::format("must list at least --ds-heavy-channel-num ({}) channels", heavy_channel_num));
      }
      std::set<int64_t> seen;
      for (int c = 0; c < heavy_channel_num; ++c) {
        const int64_t channel = row[static_cast<size_t>(c)].integer(0, head_dim - 1);
        if (!seen.insert(channel).second) row.fail(fmt::format("repeats channel {}", channel));
        out.push_back(static_cast<int32_t>(channel));
      }
    }
  }
  return config;
}

}  // namespace specula
