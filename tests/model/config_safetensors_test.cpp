// config.json and safetensors loading: good files load with the right values; unsupported or
// corrupt ones give one clear error naming the field, file or tensor.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <random>

#include "specula/core/error.h"
#include "specula/model/config.h"
#include "specula/model/safetensors.h"

namespace specula {
namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ModelConfig, ParsesLlamaWithLlama3Rope) {
  const ModelConfig c = parse_model_config(R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 128256,
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 131072,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192},
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "tie_word_embeddings": false})");
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.rope_scaling.type, "llama3");
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int>{128001, 128008, 128009}));
}

TEST(ModelConfig, ErrorsNameTheProblem) {
  EXPECT_NE(error_of([] { parse_model_config(R"({"architectures": ["GPT2LMHeadModel"]})"); })
                .find("architecture 'GPT2LMHeadModel' is not supported; supported: LlamaForCausalLM"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_model_config(R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 10})"); })
                .find("'hidden_size' is missing"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_model_config("{oops"); }).find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_of([] { load_model_config("/nonexistent/model"); }).find("/nonexistent/model"), std::string::npos);
}

TEST(ModelConfig, GenerationConfigAddsEosIdsAndNullsAreClear) {
  const auto dir = std::filesystem::temp_directory_path() / ("specula_cfg_" + std::to_string(std::random_device{}()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 300, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 1, "eos_token_id": 128001})";
  std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": [128001, 128009]})";
  EXPECT_EQ(load_model_config(dir).eos_token_ids, (std::vector<int>{128001, 128009}));
  std::filesystem::remove_all(dir);
  EXPECT_NE(error_of([] {
              parse_model_config(R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 1, "hidden_size": 64,
                "intermediate_size": 1, "num_hidden_layers": 1, "num_attention_heads": 1, "rope_theta": "big"})");
            }).find("rope_theta"),
            std::string::npos);
  // Mistral without sliding_window gets transformers' default of 4096 tokens.
  const ModelConfig m = parse_model_config(R"({"architectures": ["MistralForCausalLM"], "vocab_size": 1,
    "hidden_size": 64, "intermediate_size": 1, "num_hidden_layers": 2, "num_attention_heads": 1})");
  EXPECT_EQ(m.layer_sliding_window, (std::vector<int>{4096, 4096}));
}

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("specula_st_" + std::to_string(std::random_device{}()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void write(const std::string& header, const std::string& data, size_t cut = 0) {
    std::string bytes(8, '\0');
    uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) bytes[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
    bytes += header + data;
    if (cut > 0) bytes.resize(bytes.size() - cut);
    std::ofstream(dir_ / "model.safetensors", std::ios::binary) << bytes;
  }
  std::filesystem::path dir_;
};

TEST_F(Safetensors, ReadsValuesAndChecksShapes) {
  float values[6] = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -0.5f};
  write(R"({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}, "__metadata__": {"a": "b"}})",
        std::string(reinterpret_cast<char*>(values), 24));
  Checkpoint ckpt(dir_);
  const TensorView w = ckpt.get("w", {2, 3});
  for (int i = 0; i < 6; ++i) EXPECT_EQ(w.data_as<float>()[i], values[i]);
  EXPECT_NE(error_of([&] { ckpt.get("w", {3, 2}); }).find("tensor 'w' has shape [2, 3]; the config needs [3, 2]"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ckpt.get("missing", {1}); }).find("no tensor 'missing'"), std::string::npos);
}

TEST_F(Safetensors, CorruptOrTruncatedFilesAreClearErrors) {
  const std::string data(24, '\x01');
  write(R"({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}})", data, 8);
  EXPECT_NE(error_of([&] { Checkpoint c(dir_); }).find("truncated"), std::string::npos);
  write(R"({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 24]}})", data);
  EXPECT_NE(error_of([&] { Checkpoint c(dir_); }).find("needs 16 bytes"), std::string::npos);
  write(R"({"w": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 8]}})", data);
  EXPECT_NE(error_of([&] { Checkpoint c(dir_); }).find("dtype Q4"), std::string::npos);
  write(R"({"w": {"dtype": "F32", "shape": [4611686018427387904, 4], "data_offsets": [0, 24]}})", data);
  EXPECT_NE(error_of([&] { Checkpoint c(dir_); }).find("larger than the file"), std::string::npos);
  write("{not json", data);
  EXPECT_NE(error_of([&] { Checkpoint c(dir_); }).find("not valid JSON"), std::string::npos);
  std::ofstream(dir_ / "model.safetensors", std::ios::binary) << std::string("\xff\xff\xff\xff\xff\xff\x00\x00{}", 10);
  EXPECT_NE(error_of([&] { Checkpoint c(dir_); }).find("exceeds the file size"), std::string::npos);
  std::filesystem::remove(dir_ / "model.safetensors");
  EXPECT_NE(error_of([&] { Checkpoint c(dir_); }).find("neither model.safetensors"), std::string::npos);
}

TEST_F(Safetensors, OverlappingRangesAndDuplicateKeysAreRefused) {
  const std::string data(32, '\x02');
  write(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
            "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})", data);
  EXPECT_NE(error_of([&] { Checkpoint c(dir_); }).find("tensors 'a' [0, 16) and 'b' [8, 24) overlap"), std::string::npos);
  write(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
            "a": {"dtype": "F32", "shape": [4], "data_offsets": [16, 32]}})", data);
  EXPECT_NE(error_of([&] { Checkpoint c(dir_); }).find("the key 'a' appears twice"), std::string::npos);
  // Adjacent ranges and empty tensors at a shared offset are fine.
  write(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
            "e": {"dtype": "F32", "shape": [0], "data_offsets": [8, 8]},
            "b": {"dtype": "F32", "shape": [4], "data_offsets": [16, 32]}})", data);
  Checkpoint ok(dir_);
  EXPECT_EQ(ok.get("b", {4}).data_as<float>()[3], ok.get("a", {4}).data_as<float>()[0]);
  write(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [-1, 16]}})", data);
  EXPECT_NE(error_of([&] { Checkpoint c(dir_); }).find("'a.data_offsets[0]' = -1 is out of range"), std::string::npos);
  write(R"({"a": {"dtype": 7, "shape": [4], "data_offsets": [0, 16]}})", data);
  EXPECT_NE(error_of([&] { Checkpoint c(dir_); }).find("'a.dtype' must be a string, not 7"), std::string::npos);
}

TEST_F(Safetensors, IndexNamesOnlyShardsBesideIt) {
  std::filesystem::remove(dir_ / "model.safetensors");
  std::ofstream(dir_ / "model.safetensors.index.json") << R"({"weight_map": {"w": "../elsewhere.safetensors"}})";
  EXPECT_NE(error_of([&] { Checkpoint c(dir_); }).find("shard name '../elsewhere.safetensors' is not a file name"),
            std::string::npos);
  std::ofstream(dir_ / "model.safetensors.index.json") << R"({"weight_map": {"w": 3}})";
  EXPECT_NE(error_of([&] { Checkpoint c(dir_); }).find("'weight_map.w' must be a string, not 3"), std::string::npos);
}

TEST(ModelConfig, HostileValuesAreBoundedBeforeAnyAllocation) {
  const std::string base = R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 300, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4)";
  EXPECT_EQ(parse_model_config(base + "}").head_dim, 16);
  const ModelConfig dca = parse_model_config(base + R"(, "dual_chunk_attention_config": {"chunk_size": 64, "local_size": 16,
    "original_max_position_embeddings": 32, "sparse_attention_enabled": true}})");
  EXPECT_EQ(dca.dual_chunk.chunk_len(), 48);
  EXPECT_EQ(dca.dual_chunk.original_max_position_embeddings, 32);
  EXPECT_FALSE(dca.dual_chunk.sparse_enabled);  // enabled without a pattern: dense, as vLLM reads it
  EXPECT_EQ(dca.dual_chunk.plain_up_to(), 32);
  // Qwen2.5-1M's sparse pattern: one object per layer, one entry per query head.
  auto pattern = [](const std::string& layer0, const std::string& layer1, const std::string& extra = "") {
    return R"(, "dual_chunk_attention_config": {"chunk_size": 64, "local_size": 16, "sparse_attention_config": [)" + layer0 +
           ", " + layer1 + "]" + extra + "}}";
  };
  const std::string heads = R"({"0": ["vertical_and_slash", 30, 200, 0.9], "1": ["vertical_and_slash", 1000, 6096, 0.5],
    "2": ["vertical_and_slash", 0, 1, null], "3": ["vertical_and_slash", 7, 9]})";
  const ModelConfig sparse = parse_model_config(base + pattern(heads, heads, R"(, "sparse_attention_threshold": 40,
    "sparse_attention_last_q": 8)"));
  EXPECT_TRUE(sparse.dual_chunk.sparse_enabled);
  EXPECT_EQ(sparse.dual_chunk.sparse_threshold, 40);
  EXPECT_EQ(sparse.dual_chunk.sparse_last_q, 8);
  EXPECT_EQ(sparse.dual_chunk.plain_up_to(), 48);  // one chunk is plain attention, dense
  ASSERT_EQ(sparse.dual_chunk.sparse_vertical.size(), 2u);
  EXPECT_EQ(sparse.dual_chunk.sparse_vertical[1], std::vector<int>({130, 1000, 0, 7}));  // 30 reads as 130
  EXPECT_EQ(sparse.dual_chunk.sparse_slash[0], std::vector<int>({200, 6096, 1, 9}));
  const ModelConfig defaults = parse_model_config(base + pattern(heads, heads));
  EXPECT_EQ(defaults.dual_chunk.sparse_threshold, 32768);
  EXPECT_EQ(defaults.dual_chunk.sparse_last_q, 64);
  EXPECT_FALSE(parse_model_config(base + pattern(heads, heads, R"(, "sparse_attention_enabled": false)")).dual_chunk.sparse_enabled);
  // Without a pattern its other keys are not read (vLLM ignores them then).
  EXPECT_FALSE(parse_model_config(base + R"(, "dual_chunk_attention_config": {"sparse_attention_last_q": 0}})")
                   .dual_chunk.sparse_enabled);
  // A layer whose head 0 has this entry and heads 1-3 a valid one.
  auto layer_with_head0 = [](const std::string& head0) {
    return R"({"0": )" + head0 + R"(, "1": ["vertical_and_slash", 1, 1], "2": ["vertical_and_slash", 1, 1],
      "3": ["vertical_and_slash", 1, 1]})";
  };
  const std::pair<std::string, std::string> sparse_cases[] = {
      {pattern(heads, "{}"),
       "'dual_chunk_attention_config.sparse_attention_config[1]' must map each query head \"0\" to \"3\" to its "
       "pattern (0 entries found)"},
      {R"(, "dual_chunk_attention_config": {"sparse_attention_config": [)" + heads + "]}}",
       "'dual_chunk_attention_config.sparse_attention_config' has 1 layers; expected one object per layer (2)"},
      {R"(, "dual_chunk_attention_config": {"sparse_attention_config": {"0": {}}}})",
       "'dual_chunk_attention_config.sparse_attention_config' must be a list of one object per layer (2)"},
      {pattern(heads, R"({"0": ["vertical_and_slash", 1, 1], "1": ["vertical_and_slash", 1, 1], "2": ["vertical_and_slash", 1, 1],
        "4": ["vertical_and_slash", 1, 1]})"),
       "'dual_chunk_attention_config.sparse_attention_config[1].3' is missing"},
      {pattern(heads, layer_with_head0(R"(["block_sparse", 1, 1])")), "'block_sparse' is not supported; supported: vertical_and_slash"},
      {pattern(heads, layer_with_head0(R"(["vertical_and_slash", 1, 0])")),
       "'dual_chunk_attention_config.sparse_attention_config[1].0[2]' = 0 is out of range [1, "},
      {pattern(heads, layer_with_head0(R"(["vertical_and_slash", 1])")),
       "must be [\"vertical_and_slash\", vertical, slash, ...]"},
      {pattern(heads, heads, R"(, "sparse_attention_last_q": 0)"), "'dual_chunk_attention_config.sparse_attention_last_q' = 0 is out of range"},
  };
  const std::pair<std::string, std::string> cases[] = {
      {R"(, "head_dim": 1000000000})", "'head_dim' = 1000000000 is out of range [1, 1024]"},
      {R"(, "head_dim": 1e9})", "'head_dim' must be an integer"},
      {R"(, "num_key_value_heads": 0})", "'num_key_value_heads' = 0 is out of range [1, 4]"},
      {R"(, "rope_theta": 1e309})", "number overflow"},
      {R"(, "rope_theta": -5})", "rope_theta -5 must be positive"},
      {R"(, "tie_word_embeddings": "yes"})", "'tie_word_embeddings' must be true or false"},
      {R"(, "eos_token_id": [1, -2]})", "'eos_token_id[1]' = -2 is out of range"},
      {R"(, "vocab_size": 7})", "the key 'vocab_size' appears twice"},
      {R"(, "rope_scaling": {"rope_type": "llama3", "factor": 8, "original_max_position_embeddings": 1e12}})",
       "original_max_position_embeddings 1000000000000 is out of range"},
      {R"(, "dual_chunk_attention_config": {"chunk_size": 4096, "local_size": 4096}})",
       "dual_chunk_attention_config local_size 4096 must be below chunk_size 4096"},
      {R"(, "dual_chunk_attention_config": {"chunk_size": 1}})", "'dual_chunk_attention_config.chunk_size' = 1 is out of range"},
  };
  std::vector<std::pair<std::string, std::string>> all(std::begin(cases), std::end(cases));
  all.insert(all.end(), std::begin(sparse_cases), std::end(sparse_cases));
  for (const auto& [tail, message] : all) {
    const std::string text = base + tail;
    const std::string error = error_of([&] { parse_model_config(text); });
    EXPECT_NE(error.find(message), std::string::npos) << text << "\n -> " << error;
    EXPECT_EQ(error.find("json.exception"), std::string::npos) << error;
  }
  // The huge-vocabulary model of every mutation above still has clear bounds.
  EXPECT_NE(error_of([&] { parse_model_config(R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 4611686018427387904,
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4})"); })
                .find("'vocab_size' = 4611686018427387904 is out of range [1, 16777216]"),
            std::string::npos);
}

}  // namespace
}  // namespace specula
