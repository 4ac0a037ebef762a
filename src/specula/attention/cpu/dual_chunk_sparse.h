// Dual chunk attention's sparse prefill on the CPU: the vertical-and-slash pattern that
// Qwen2.5-1M's sparse_attention_config describes (MInference's pattern, as vLLM's and SGLang's
// dual chunk backends apply it), the reference for a GPU version.
//
// A sparse run is one sequence's new tokens at KV positions [begin, end), all in one chunk, in a
// prefill or extend step of at least two new tokens whose sequence then holds more than
// pattern.threshold keys (vLLM compares the prompt's whole length, so the first chunks of a long
// prompt prefilled in pieces attend densely here and sparsely there). For each query head, its last
// n = min(end - begin, last_q) queries score every key j <= their position P in one softmax per
// query (the key's chunk picks the variant: intra for its own chunk, and for earlier chunks the
// successive and inter variants at their unclamped positions, variants 3 and 4, which exist only
// to estimate). The probabilities summed per key column j give the vertical scores, summed per
// distance P - j the slash scores; the first forced_vertical columns and the forced_slash
// nearest distances score +inf (so they rank first: with fewer lines kept, the lowest of them).
// The head keeps its top vertical[h] columns and top slash[h] distances (ties: the lower index),
// and each query of the run at position P attends to the keys
// j <= P with a kept column or a kept distance P - j, through its ordinary variants, in one
// softmax.
//
// Where this differs from vLLM's backend, which applies the pattern through a block-sparse
// kernel: the pattern here is exact per key, where vLLM's kernel widens each slash to the 64-key
// blocks it crosses; distances are global (query position minus key position) in every part;
// and where vLLM adds five evenly spaced indices to a part that got no vertical line (or, in the
// successive and inter parts, no slash line), nothing is added here.
#pragma once

#include <vector>

#include "specula/attention/backend.h"
#include "specula/attention/cpu/tile_kernel.h"

namespace specula {

struct DualChunkShape;

// The keys a sparse run keeps: key j for the query at position P when column[j] or
// distance[P - j]; both are [end] long.
struct VerticalSlashKeep {
  std::vector<bool> column;
  std::vector<bool> distance;
  bool keeps(int pos, int key) const {
    return column[static_cast<size_t>(key)] || distance[static_cast<size_t>(pos - key)];
  }
};

// Query head `head`'s kept keys for the run [begin, end) of seq. params.q holds five variants
// per head (q_stride_head = 5 * head_dim); `logit_scale` is the long-context temperature of the
// sequence's length (dual_chunk_logit_scale).
VerticalSlashKeep select_vertical_slash(const CpuAttentionParams& params, const DualChunkShape& shape,
                                        const DualChunkSparsePattern& pattern, const CpuAttentionSeq& seq, int begin,
                                        int end, int head, double logit_scale);

// Indices of the `keep` largest scores (ties: the lower index), as a mask over scores.size().
std::vector<bool> top_scores(const std::vector<double>& scores, int keep);

}  // namespace specula
