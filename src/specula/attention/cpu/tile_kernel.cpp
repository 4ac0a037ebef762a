// Planning and ISA dispatch for the CPU attention kernel.
#include "specula/attention/cpu/tile_kernel.h"

#include "specula/attention/cpu/decode_kernel.h"
#include "specula/attention/cpu/decode_split.h"

#include <algorithm>

#include "specula/core/error.h"
#include "specula/core/thread_pool.h"

namespace specula {

CpuAttentionPlan plan_cpu_attention(std::span<const CpuAttentionSeq> seqs, int num_q_heads, int num_kv_heads) {
  SPECULA_ASSERT(num_kv_heads >= 1 && num_q_heads % num_kv_heads == 0);
  const int group = num_q_heads / num_kv_heads;
  int32_t max_q_len = 1;
  for (const auto& s : seqs) max_q_len = std::max(max_q_len, s.q_len);

  CpuAttentionPlan plan;
  const int heads_per_item = std::min(group, 16);
  const int rows_wanted = heads_per_item * std::min<int>(max_q_len, std::max(1, 16 / heads_per_item));
  // Eight lanes when they suffice (decode with small GQA groups): half the wasted FMAs.
  plan.lanes = rows_wanted <= 8 ? 8 : 16;
  const int tokens_per_item = std::max(1, plan.lanes / heads_per_item);

  for (int32_t s = 0; s < static_cast<int32_t>(seqs.size()); ++s) {
    for (int32_t q = 0; q < seqs[s].q_len; q += tokens_per_item) {
      for (int32_t h = 0; h < num_kv_heads; ++h) {
        for (int32_t hb = 0; hb < group; hb += heads_per_item) {
          plan.items.push_back({s, h, hb, std::min(heads_per_item, group - hb), q,
                                std::min(tokens_per_item, seqs[s].q_len - q)});
        }
      }
    }
  }
  // Cost ~ keys visited; causal items late in a sequence visit the most.
  auto cost = [&](const CpuWorkItem& it) {
    const auto& s = seqs[it.seq];
    return std::min<int64_t>(s.kv_len, static_cast<int64_t>(s.q_kv_offset) + it.q_begin + it.q_count);
  };
  std::stable_sort(plan.items.begin(), plan.items.end(),
                   [&](const CpuWorkItem& a, const CpuWorkItem& b) { return cost(a) > cost(b); });
  return plan;
}

CpuIsa best_cpu_isa() {
#if defined(__x86_64__)
  static const bool has_avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                                 __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  return has_avx512 ? CpuIsa::avx512 : CpuIsa::generic;
#else
  return CpuIsa::generic;
#endif
}

const char* cpu_isa_name(CpuIsa isa) { return isa == CpuIsa::avx512 ? "avx512" : "generic"; }

bool cpu_has_avx512_bf16() {
#if defined(__x86_64__)
  static const bool has = best_cpu_isa() == CpuIsa::avx512 && __builtin_cpu_supports("avx512bf16");
  return has;
#else
  return false;
#endif
}

void run_cpu_attention(CpuIsa isa, const CpuAttentionParams& params, std::span<const CpuAttentionSeq> seqs,
                       const CpuAttentionPlan& plan, std::vector<CpuAttentionScratch>& scratch, ThreadPool& pool) {
  SPECULA_CHECK(isa == CpuIsa::generic || best_cpu_isa() == CpuIsa::avx512,
                "the avx512 CPU kernel was requested but this processor lacks AVX-512");
  if (scratch.size() < static_cast<size_t>(pool.num_threads())) scratch.resize(static_cast<size_t>(pool.num_threads()));
  // One-token items of bf16 KV go to the decode kernel where the processor has BF16 dot products.
  const bool decode = isa == CpuIsa::avx512 && cpu_has_avx512_bf16() && cpu_avx512bf16::decode_supported(params);
  size_t need = cpu_attention_scratch_floats(params.head_dim, params.v_head_dim, plan.lanes);
  if (decode) need = std::max(need, decode_scratch_floats(params.head_dim, params.v_head_dim, kMaxDecodeHeads));
  for (auto& s : scratch) {
    if (s.buffer.size() < need) s.buffer.resize(need);
  }
  auto* run_item = isa == CpuIsa::avx512 ? &cpu_avx512::run_item : &cpu_generic::run_item;
  // The decode kernel's long rows go in chunks of keys (decode_split.h).
  const DecodeSplit split = decode ? split_decode_items(params, seqs, plan.items) : DecodeSplit{};
  const std::vector<CpuWorkItem>& items = decode ? split.items : plan.items;
  // The chunks' partial results: kept per calling thread from call to call (every layer of a
  // step asks for the same size; each chunk writes its whole slot before the merge reads it). The
  // buffer only grows and lives as long as the thread; the pool's threads reach it through this
  // pointer (a thread_local named in the lambda would be each worker's own).
  thread_local std::vector<float> held;
  if (held.size() < static_cast<size_t>(split.partial_floats)) held.resize(static_cast<size_t>(split.partial_floats));
  float* const partials = held.data();
  pool.parallel_for(static_cast<int64_t>(items.size()), [&](int64_t i, int thread) {
    const CpuWorkItem& item = items[static_cast<size_t>(i)];
    const CpuAttentionSeq& seq = seqs[static_cast<size_t>(item.seq)];
    CpuAttentionScratch& mine = scratch[static_cast<size_t>(thread)];
    // The planner's items hold at most 16 query heads (kMaxDecodeHeads).
    if (decode && item.q_count == 1) {
      cpu_avx512bf16::decode_item(params, seq, item, mine, partials);
    } else {
      run_item(params, seq, item, plan.lanes, mine);
    }
  });
  if (!split.merges.empty()) merge_decode_chunks(params, seqs, split, partials, pool);
}

}  // namespace specula
