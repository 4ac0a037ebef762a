// MlaExpandedPass: the step's passes over the requests' cached rows (host plan, one upload), and
// per layer the gather / expand / attend / merge sequence of every pass.
#include "specula/attention/mla/cuda/mla_expanded.h"

#include <algorithm>

#include "specula/attention/cuda/kernels/attention_params.h"
#include "specula/core/dtype_codes.h"
#include "specula/attention/cuda/kernels/merge_state.h"
#include "specula/attention/cuda/kernels/prefill_wgmma.h"
#include "specula/attention/mla/cuda/kernels/gather_latent.h"
#include "specula/attention/mla/cuda/kernels/mla_attention.h"
#include "specula/core/cuda_check.h"
#include "specula/core/error.h"

namespace specula {

namespace ck = cuda_kernels;

namespace {

constexpr int kQkWidth = 192;  // the widths the expanded kernel is built for
constexpr int kVWidth = 128;

}  // namespace

int64_t default_expanded_chunk_rows(int num_q_heads) {
  const int64_t per_row = 2 * (ck::kMlaLoraRank + ck::kMlaRopeDim) + static_cast<int64_t>(num_q_heads) * 2 * (kQkWidth + kVWidth);
  const int64_t rows = (int64_t{512} << 20) / per_row;
  return std::max<int64_t>(ck::kPrefillTileRows, rows / ck::kPrefillTileRows * ck::kPrefillTileRows);
}

std::string expanded_layer_problem(const MlaLayer& layer) {
  if (layer.qk_nope_head_dim + layer.qk_rope_head_dim != kQkWidth || layer.v_head_dim != kVWidth) {
    return fmt::format("the expanded form is built for qk_nope_head_dim + qk_rope_head_dim = {} and v_head_dim = {}, "
                       "not {} + {} and {}", kQkWidth, kVWidth, layer.qk_nope_head_dim, layer.qk_rope_head_dim,
                       layer.v_head_dim);
  }
  return {};
}

void MlaExpandedPass::plan(const std::vector<int32_t>& kv_lens, const std::vector<int32_t>& q_lens,
                           const std::vector<int32_t>& slots, int64_t chunk_rows) {
  SPECULA_CHECK(chunk_rows >= 1, "expanded_chunk_rows {} must be >= 1", chunk_rows);
  const int bs = static_cast<int>(kv_lens.size());
  batch_size_ = bs;
  std::vector<int32_t> cu_q(static_cast<size_t>(bs) + 1, 0), items;
  std::vector<int64_t> row0(static_cast<size_t>(bs) + 1, 0);
  for (int i = 0; i < bs; ++i) {
    const auto ui = static_cast<size_t>(i);
    cu_q[ui + 1] = cu_q[ui] + q_lens[ui];
    row0[ui + 1] = row0[ui] + kv_lens[ui];
    for (int t = 0; t < q_lens[ui]; t += ck::kPrefillTileRows) items.insert(items.end(), {i, t});
  }
  num_tokens_ = cu_q.back();
  num_items_ = static_cast<int>(items.size() / 2);
  const int64_t total = row0.back();
  SPECULA_CHECK(static_cast<int64_t>(slots.size()) == total, "expanded plan: {} slots for {} cached rows",
                slots.size(), total);
  // Each pass: every request's overlap with the pass's rows, as (row in the pass, keys, the KV
  // index of the request's first query relative to the pass's first key).
  passes_.clear();
  std::vector<int32_t> meta;
  for (int64_t g0 = 0; g0 < total; g0 += chunk_rows) {
    const int64_t g1 = std::min(total, g0 + chunk_rows);
    passes_.push_back({g0, g1 - g0});
    std::vector<int32_t> start(static_cast<size_t>(bs), 0), len(static_cast<size_t>(bs), 0), off(static_cast<size_t>(bs), 0);
    for (int i = 0; i < bs; ++i) {
      const auto ui = static_cast<size_t>(i);
      const int64_t a = std::max(g0, row0[ui]), b = std::min(g1, row0[ui + 1]);
      const int64_t first_key = a - row0[ui];
      off[ui] = static_cast<int32_t>(kv_lens[ui] - q_lens[ui] - first_key);
      if (b > a) {
        start[ui] = static_cast<int32_t>(a - g0);
        len[ui] = static_cast<int32_t>(b - a);
      }
    }
    for (const auto* v : {&start, &len, &off}) meta.insert(meta.end(), v->begin(), v->end());
  }
  slots_.upload(slots, device_, uploads_);
  cu_q_.upload(cu_q, device_, uploads_);
  items_.upload(items, device_, uploads_);
  pass_meta_.upload(meta, device_, uploads_);
  uploads_.flush(stream_);
}

void MlaExpandedPass::run(const TensorView& q, const TensorView& out, const TensorView& lse, const uint8_t* cache,
                          bool fp8, int64_t row_bytes, const MlaLayer& layer, const float* sinks,
                          const MlaExpandFn& expand) {
  const int H = layer.num_q_heads;
  const int64_t n = num_tokens_;
  if (n == 0) return;
  int64_t max_rows = 0;
  for (const Pass& p : passes_) max_rows = std::max(max_rows, p.rows);
  // The pass buffers only grow (eager steps; the expanded form never runs in a CUDA graph).
  kv_c_.reserve(max_rows * ck::kMlaLoraRank, device_);
  k_pe_.reserve(max_rows * ck::kMlaRopeDim, device_);
  k_.reserve(max_rows * H * kQkWidth, device_);
  v_.reserve(max_rows * H * kVWidth, device_);
  void* kv_c = kv_c_.data();
  void* k_pe = k_pe_.data();
  void* k = k_.data();
  void* v = v_.data();
  if (!lse.defined()) lse_.reserve(n * H, device_);
  auto* lse_out = lse.defined() ? lse.data_as<float>() : lse_.data();
  if (passes_.size() > 1) {
    part_out_.reserve(n * H * kVWidth, device_);
    part_lse_.reserve(n * H, device_);
  }
  const int bs = batch_size_;
  for (size_t i = 0; i < passes_.size(); ++i) {
    const Pass& pass = passes_[i];
    ck::GatherLatentParams g{};
    g.cache = cache;
    g.fp8 = fp8 ? 1 : 0;
    g.row_bytes = row_bytes;
    g.slots = slots_.data() + pass.first_row;
    g.rows = pass.rows;
    g.kv_c = kv_c;
    g.k_pe = k_pe;
    ck::launch_gather_latent(g, stream_);
    expand(kv_c, k_pe, pass.rows, k, v);

    const bool first = i == 0;
    const int32_t* meta = pass_meta_.data() + static_cast<int64_t>(i) * 3 * bs;
    ck::AttentionParams p{};
    p.q = q.data();
    p.q_stride_token = static_cast<int64_t>(H) * kQkWidth;
    p.q_stride_head = kQkWidth;
    p.out = first ? out.data() : part_out_.data();
    p.out_stride_token = static_cast<int64_t>(H) * kVWidth;
    p.out_stride_head = kVWidth;
    p.lse = first ? lse_out : part_lse_.data();
    p.lse_stride_token = H;
    p.io_dtype = ck::kBF16;
    p.k_cache = k;
    p.v_cache = v;
    p.kv_dtype = ck::kBF16;
    p.k_descale = 1.0f;
    p.v_descale = 1.0f;
    p.num_q_heads = H;
    p.num_kv_heads = H;
    p.head_dim = kQkWidth;
    p.v_head_dim = kVWidth;
    p.page_size = 1;
    p.scale = layer.scaling;
    p.window_left = -1;
    p.causal = 1;
    // A sink joins the denominator once: in the first pass, which the merges then carry along.
    p.sinks = first ? sinks : nullptr;
    p.num_seqs = bs;
    p.cu_seqlens_q = cu_q_.data();
    p.kv_row_start = meta;
    p.num_kv_rows = pass.rows;
    p.seq_lens_k = meta + bs;
    p.q_kv_offset = meta + 2 * bs;
    SPECULA_CHECK(ck::prefill_wgmma_supports(p),
                  "the expanded MLA prefill kernel is not built for head_dim {} / v_head_dim {} with query dtype code "
                  "{} and KV dtype code {}; it is built for head_dim {} / v_head_dim {} with both bf16 (code {})",
                  p.head_dim, p.v_head_dim, static_cast<int>(p.io_dtype), static_cast<int>(p.kv_dtype), kQkWidth,
                  kVWidth, static_cast<int>(ck::kBF16));
    const int group = ck::prefill_head_group(pass.rows * 2 * (kQkWidth + kVWidth), H, H, l2_bytes_);
    ck::launch_prefill_wgmma(p, ck::PrefillWork{items_.data(), num_items_, group}, stream_);
    CUDA_CHECK(cudaGetLastError());
    if (!first) {
      ck::MergeStateParams m{};
      m.v_a = out.data();
      m.s_a = lse_out;
      m.v_b = part_out_.data();
      m.s_b = part_lse_.data();
      m.v_out = out.data();
      m.s_out = lse_out;
      m.dtype = ck::kBF16;
      m.num_rows = n * H;
      m.head_dim = kVWidth;
      ck::launch_merge_state(m, stream_);
    }
  }
}

}  // namespace specula
