// Structured output under speculative decoding: the formats the CPU and GPU tests compare, and
// the greedy outputs of an engine over them.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "grammar/ajv_validator.h"
#include "runtime/engine_fixtures.h"
#include "specula/grammar/output_format.h"
#include "specula/runtime/engine.h"

namespace specula::spec_grammar {

using grammar::OutputFormat;
using testing_fixtures::kModel;
using testing_fixtures::kTexts;

inline OutputFormat compiled(OutputFormat::Kind kind, std::string source) {
  OutputFormat f;
  f.kind = kind;
  f.source = std::move(source);
  grammar::compile(f);
  return f;
}

inline std::vector<std::pair<std::string, OutputFormat>> formats() {
  std::vector<std::pair<std::string, OutputFormat>> out = {
      {"json_object", compiled(OutputFormat::Kind::kJsonObject, "")},
      {"regex", compiled(OutputFormat::Kind::kRegex, "(the|a) [a-z]{2,8}( [a-z]{1,8}){1,6}\\.")},
      {"grammar", compiled(OutputFormat::Kind::kGrammar,
                           "root ::= line{2,4}\nline ::= [A-Z] [a-z ]{3,30} [.!?] \"\\n\"\n")},
  };
  const auto corpus = grammar::testing::schema_corpus();
  for (size_t i : {0u, 11u, 23u, 37u}) {
    out.emplace_back(corpus[i]["name"].get<std::string>(), compiled(OutputFormat::Kind::kJsonSchema, corpus[i]["schema"].dump()));
  }
  return out;
}

// Every schema of the corpus.
inline std::vector<std::pair<std::string, OutputFormat>> corpus_formats() {
  std::vector<std::pair<std::string, OutputFormat>> fs;
  for (const auto& entry : grammar::testing::schema_corpus()) {
    fs.emplace_back(entry["name"].get<std::string>(), compiled(OutputFormat::Kind::kJsonSchema, entry["schema"].dump()));
  }
  return fs;
}

// Greedy outputs of `prompts` prompts per format on an engine with these options and the given
// speculation (none: nullopt).
inline std::vector<std::vector<int32_t>> outputs(EngineOptions o, const std::optional<EagleOptions>& spec,
                                          const std::vector<std::pair<std::string, OutputFormat>>& fs,
                                          std::vector<std::string>* reasons = nullptr, bool ignore_eos = false,
                                          size_t prompts = 2, int max_new = 160, int logprobs = -1) {
  o.speculative = spec;
  Engine engine(kModel, o);
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (const auto& [name, f] : fs) {
    for (size_t t = 0; t < prompts; ++t) {
      EngineRequest r;
      r.prompt = kTexts[t * 3];
      r.max_new_tokens = max_new;
      r.format = f;
      r.ignore_eos = ignore_eos;
      r.logprobs = logprobs;
      handles.push_back(engine.submit(std::move(r)));
    }
  }
  engine.run_until_idle();
  std::vector<std::vector<int32_t>> out;
  for (auto& h : handles) {
    const RequestOutput r = h->wait();
    EXPECT_TRUE(r.finish_reason == "stop" || r.finish_reason == "length") << r.finish_reason;
    if (reasons != nullptr) reasons->push_back(r.finish_reason);
    if (spec && r.output_ids.size() > 4) {
      EXPECT_GT(r.spec_verify_cycles, 0);
    }
    out.push_back(r.output_ids);
  }
  return out;
}

// The speculation the CPU and GPU tests compare with plain decoding: both heads, a chain and a
// tree each, page sizes 1 and 16.
struct SpecShape {
  EagleKind kind;
  SpecParams params;
  int page_size;
  std::string name() const {
    return std::string(eagle_kind_name(kind)) + " (" + std::to_string(params.num_steps) + ", " +
           std::to_string(params.topk) + ", " + std::to_string(params.num_draft_tokens) + ") page " +
           std::to_string(page_size);
  }
};
inline const std::vector<SpecShape>& spec_shapes() {
  static const std::vector<SpecShape> shapes = {{EagleKind::EAGLE3, {3, 1, 4}, 16},
                                                {EagleKind::EAGLE3, {4, 4, 10}, 1},
                                                {EagleKind::EAGLE, {3, 1, 4}, 1},
                                                {EagleKind::EAGLE, {4, 4, 10}, 16}};
  return shapes;
}

// Where two outputs first differ and the tokens around it (for failure messages).
inline std::string first_difference(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  if (i == a.size() && i == b.size()) return "equal";
  auto window = [i](const std::vector<int32_t>& v) {
    std::string out;
    for (size_t k = i >= 4 ? i - 4 : 0; k < std::min(v.size(), i + 6); ++k) out += (k == i ? " [" : " ") + std::to_string(v[k]) + (k == i ? "]" : "");
    return out;
  };
  return "first difference at token " + std::to_string(i) + " of " + std::to_string(a.size()) + " / " +
         std::to_string(b.size()) + ":" + window(a) + "  vs" + window(b);
}

}  // namespace specula::spec_grammar
