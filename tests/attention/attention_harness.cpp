// AttentionHarness implementation.
#include "attention/attention_harness.h"

#include <cstdint>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <type_traits>

#include "attention/reference_attention.h"
#include "specula/kv/token_allocator.h"

namespace specula::testing {

namespace {
std::vector<float> random_rounded(size_t n, DType dtype, std::mt19937_64& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) {
    float raw = dist(rng);
    uint8_t buf[4];
    store_from_float(buf, dtype, 0, raw);
    x = load_as_float(buf, dtype, 0);
  }
  return v;
}
}  // namespace

AttentionHarness::AttentionHarness(const HarnessConfig& config, uint64_t seed) : config_(config) {
  std::mt19937_64 rng(seed);
  auto& c = config_;
  if (c.v_head_dim == 0) c.v_head_dim = c.head_dim;
  layer_.layer_id = 1;  // not 0: catches code that ignores the layer index
  layer_.num_q_heads = c.num_q_heads;
  layer_.num_kv_heads = c.num_kv_heads;
  layer_.head_dim = c.head_dim;
  layer_.v_head_dim = c.v_head_dim;
  layer_.scaling = c.scaling;
  layer_.logit_cap = c.logit_cap;
  layer_.sliding_window_size = c.window_left;
  layer_.use_local_attention = c.chunk_size > 0;
  layer_.attn_type = c.causal ? AttentionType::DECODER : AttentionType::ENCODER_ONLY;
  layer_.dca_chunk_len = c.dca_chunk_len;
  layer_.dca_original_max_position = c.dca_original_max;
  layer_.dca_sparse = c.dca_sparse;
  if (c.sinks) {
    std::normal_distribution<float> dist(0.5f, 1.5f);
    for (int h = 0; h < c.num_q_heads; ++h) layer_.sinks.push_back(dist(rng));
  }

  const int n = static_cast<int>(c.requests.size());
  int64_t total_pages = 0;
  int max_len = 1;
  for (const auto& r : c.requests) {
    total_pages += (r.prefix_len + r.extend_len + c.page_size - 1) / c.page_size + 1;
    max_len = std::max(max_len, r.prefix_len + r.extend_len);
  }
  // Spare pages so slots of different requests interleave after the shuffle.
  PagedTokenAllocator allocator((total_pages + 3) * c.page_size, c.page_size);
  kv_pool_ = std::make_unique<MHAKVPool>(KVPoolConfig{allocator.total_slots(), 2, c.num_kv_heads, c.head_dim,
                                                      c.v_head_dim, c.kv_dtype, Device::cpu()});
  kv_pool_->set_kv_scales(layer_.layer_id, c.k_scale, c.v_scale);
  req_pool_ = std::make_unique<ReqToTokenPool>(n + 3, max_len);

  auto all = allocator.alloc(allocator.num_pages() * c.page_size);
  std::vector<int32_t> pages;
  for (size_t i = 0; i < all->size(); i += static_cast<size_t>(c.page_size)) pages.push_back((*all)[i] / c.page_size);
  std::shuffle(pages.begin(), pages.end(), rng);
  size_t next_page = 0;

  for (int r = 0; r < n; ++r) {
    const auto& spec = c.requests[static_cast<size_t>(r)];
    const int len = spec.prefix_len + spec.extend_len;
    std::vector<int32_t> slots(static_cast<size_t>(len));
    int32_t page = 0;
    for (int t = 0; t < len; ++t) {
      if (t % c.page_size == 0) page = pages[next_page++];
      slots[static_cast<size_t>(t)] = page * c.page_size + t % c.page_size;
    }
    // Request r uses request slot r + 2: the table's rows are not the batch indices.
    req_pool_->write(r + 2, 0, slots);
    token_slots_.push_back(slots);

    // The cached prefix goes in through set_kv_buffer, as an earlier step would have put it.
    if (spec.prefix_len > 0) {
      const auto kp = random_rounded(static_cast<size_t>(spec.prefix_len) * c.num_kv_heads * c.head_dim, DType::f32, rng);
      const auto vp = random_rounded(static_cast<size_t>(spec.prefix_len) * c.num_kv_heads * c.v_head_dim, DType::f32, rng);
      kv_pool_->set_kv_buffer(layer_.layer_id, std::span<const int32_t>(slots.data(), static_cast<size_t>(spec.prefix_len)),
                              TensorView(const_cast<float*>(kp.data()), DType::f32, {spec.prefix_len, c.num_kv_heads, c.head_dim}),
                              TensorView(const_cast<float*>(vp.data()), DType::f32, {spec.prefix_len, c.num_kv_heads, c.v_head_dim}));
    }
    new_q_.push_back(random_rounded(static_cast<size_t>(spec.extend_len) * c.num_q_heads * q_width(), c.q_dtype, rng));
    new_k_.push_back(random_rounded(static_cast<size_t>(spec.extend_len) * c.num_kv_heads * c.head_dim, c.q_dtype, rng));
    new_v_.push_back(random_rounded(static_cast<size_t>(spec.extend_len) * c.num_kv_heads * c.v_head_dim, c.q_dtype, rng));

    if (c.tree_mask) {
      // Draft token 0 is the root; every other token hangs under a random earlier one. A token
      // sees the whole prefix, its ancestors and itself.
      const int m = spec.extend_len;
      std::vector<int> parent(static_cast<size_t>(m), -1);
      for (int i = 1; i < m; ++i) parent[static_cast<size_t>(i)] = static_cast<int>(rng() % static_cast<uint64_t>(i));
      std::vector<uint8_t> mask(static_cast<size_t>(m) * len, 0);
      for (int i = 0; i < m; ++i) {
        for (int j = 0; j < spec.prefix_len; ++j) mask[static_cast<size_t>(i) * len + j] = 1;
        for (int a = i; a >= 0; a = parent[static_cast<size_t>(a)]) mask[static_cast<size_t>(i) * len + spec.prefix_len + a] = 1;
      }
      if (c.hide_first_draft_row) std::fill(mask.begin(), mask.begin() + len, 0);
      tree_masks_.push_back(std::move(mask));
    }
  }
}

AttentionBackendOptions AttentionHarness::backend_options() const {
  AttentionBackendOptions o;
  o.page_size = config_.page_size;
  o.attention_chunk_size = config_.chunk_size;
  return o;
}

std::vector<int> AttentionHarness::all_requests() const {
  std::vector<int> r(config_.requests.size());
  std::iota(r.begin(), r.end(), 0);
  return r;
}

ForwardBatch AttentionHarness::make_batch(const std::vector<int>& requests) const {
  ForwardBatch b;
  b.forward_mode = config_.mode;
  b.batch_size = static_cast<int>(requests.size());
  b.req_to_token_pool = req_pool_.get();
  b.token_to_kv_pool = kv_pool_.get();
  if (config_.mode == ForwardMode::TARGET_VERIFY) {
    b.spec_info = std::make_shared<SpecInfo>();
    b.spec_info->num_draft_tokens = config_.requests.at(static_cast<size_t>(requests.at(0))).extend_len;
    b.spec_info->prefix_visible = config_.prefix_visible;
  }
  for (int r : requests) {
    const auto& spec = config_.requests[static_cast<size_t>(r)];
    b.req_pool_indices.push_back(r + 2);
    const int len = spec.prefix_len + spec.extend_len;
    if (config_.mode == ForwardMode::TARGET_VERIFY) {
      b.seq_lens.push_back(spec.prefix_len);
      if (config_.tree_mask) {
        const auto& m = tree_masks_[static_cast<size_t>(r)];
        b.spec_info->custom_mask.insert(b.spec_info->custom_mask.end(), m.begin(), m.end());
      }
    } else {
      b.seq_lens.push_back(len);
    }
    if (config_.mode != ForwardMode::DECODE && config_.mode != ForwardMode::TARGET_VERIFY) {
      b.extend_prefix_lens.push_back(spec.prefix_len);
      b.extend_seq_lens.push_back(spec.extend_len);
    }
    for (int t = spec.prefix_len; t < len; ++t) {
      b.out_cache_loc.push_back(token_slots_[static_cast<size_t>(r)][static_cast<size_t>(t)]);
      b.positions.push_back(t);
    }
  }
  return b;
}

AttentionResult AttentionHarness::run(AttentionBackend& backend, const std::vector<int>& only) {
  return run_with(backend, *kv_pool_, Device::cpu(), only);
}

AttentionResult AttentionHarness::run_on_device(AttentionBackend& backend, Device device, const std::vector<int>& only) {
  if (device.is_cpu()) return run(backend, only);
  KVPoolConfig config = kv_pool_->config();
  config.device = device;
  MHAKVPool mirror(config);
  for (int l = 0; l < config.num_layers; ++l) {
    copy(mirror.k_buffer(l), kv_pool_->k_buffer(l));
    copy(mirror.v_buffer(l), kv_pool_->v_buffer(l));
    mirror.set_kv_scales(l, kv_pool_->k_scale(l), kv_pool_->v_scale(l));
  }
  return run_with(backend, mirror, device, only);
}

AttentionResult AttentionHarness::run_with(AttentionBackend& backend, MHAKVPool& pool, Device device,
                                           const std::vector<int>& only) {
  const std::vector<int> requests = only.empty() ? all_requests() : only;
  ForwardBatch batch = make_batch(requests);
  batch.token_to_kv_pool = &pool;
  const auto& c = config_;
  const int64_t n = batch.num_tokens();
  Buffer q(c.q_dtype, {n, c.num_q_heads, q_width()});
  Buffer k(c.q_dtype, {n, c.num_kv_heads, c.head_dim});
  Buffer v(c.q_dtype, {n, c.num_kv_heads, c.v_head_dim});
  Buffer out(c.q_dtype, {n, c.num_q_heads, c.v_head_dim});
  Buffer lse(DType::f32, {n, c.num_q_heads});
  int64_t row = 0;
  for (int r : requests) {
    auto put = [&](const std::vector<float>& src, const Buffer& dst, int64_t row_elems) {
      convert_from_float(src.data(), static_cast<char*>(dst.data()) + row * row_elems * static_cast<int64_t>(dtype_size(dst.dtype())),
                         dst.dtype(), src.size());
    };
    put(new_q_[static_cast<size_t>(r)], q, c.num_q_heads * q_width());
    put(new_k_[static_cast<size_t>(r)], k, c.num_kv_heads * c.head_dim);
    put(new_v_[static_cast<size_t>(r)], v, c.num_kv_heads * c.v_head_dim);
    row += c.requests[static_cast<size_t>(r)].extend_len;
  }
  // Poison the outputs: a row the backend forgets to write cannot pass.
  for (int64_t i = 0; i < out.numel(); ++i) store_from_float(out.data(), out.dtype(), static_cast<size_t>(i), NAN);
  for (int64_t i = 0; i < lse.numel(); ++i) lse.data_as<float>()[i] = NAN;

  Buffer dq, dk, dv, dout, dlse;
  TensorView qv = q, kv = k, vv = v, outv = out, lsev = lse;
  if (device.is_cuda()) {
    dq = Buffer(q.dtype(), q.shape(), device);
    dk = Buffer(k.dtype(), k.shape(), device);
    dv = Buffer(v.dtype(), v.shape(), device);
    dout = Buffer(out.dtype(), out.shape(), device);
    dlse = Buffer(DType::f32, lse.shape(), device);
    copy(dq, q);
    copy(dk, k);
    copy(dv, v);
    copy(dout, out);
    copy(dlse, lse);
    qv = dq;
    kv = dk;
    vv = dv;
    outv = dout;
    lsev = dlse;
  }

  backend.check_layer(layer_, c.q_dtype, c.kv_dtype);
  backend.init_forward_metadata(batch);
  ForwardOptions options;
  options.lse = lsev;
  backend.forward(qv, kv, vv, outv, layer_, batch, options);
  if (device.is_cuda()) {
    copy(out, dout);  // synchronous: also waits for the kernels
    copy(lse, dlse);
  }

  AttentionResult result;
  result.out.resize(static_cast<size_t>(out.numel()));
  for (size_t i = 0; i < result.out.size(); ++i) result.out[i] = load_as_float(out.data(), out.dtype(), i);
  result.lse.assign(lse.data_as<float>(), lse.data_as<float>() + lse.numel());
  return result;
}

template <typename T>
AttentionResult AttentionHarness::reference(const std::vector<int>& only, bool round_probs) const {
  const std::vector<int> requests = only.empty() ? all_requests() : only;
  const auto& c = config_;
  ReferenceLayer rl;
  rl.num_q_heads = c.num_q_heads;
  rl.num_kv_heads = c.num_kv_heads;
  rl.head_dim = c.head_dim;
  rl.v_head_dim = c.v_head_dim;
  rl.scale = layer_.effective_scaling();
  rl.logit_cap = c.logit_cap;
  rl.sinks = layer_.sinks;
  MaskRules rules;
  rules.causal = c.causal && !c.tree_mask;
  rules.window_left = c.window_left;
  rules.chunk_size = c.chunk_size;
  const bool fp8 = c.kv_dtype == DType::fp8_e4m3;

  AttentionResult result;
  for (int r : requests) {
    const auto& spec = c.requests[static_cast<size_t>(r)];
    const int len = spec.prefix_len + spec.extend_len;
    // K/V straight from the pool's storage, token by token through req_to_token (not pages).
    std::vector<double> k(static_cast<size_t>(len) * c.num_kv_heads * c.head_dim);
    std::vector<double> v(static_cast<size_t>(len) * c.num_kv_heads * c.v_head_dim);
    const int32_t* row = req_pool_->row(r + 2);
    // New tokens' K/V as a cache of this dtype must hold them, computed here from the definition
    // (divide by the scale, saturate for fp8, round to nearest even, multiply back), not through
    // set_kv_buffer; the prefix is read back from the pool's storage.
    auto cached = [&](float x, float scale) {
      float y = fp8 ? std::clamp(x / scale, -kFp8E4m3Max, kFp8E4m3Max) : x;
      uint8_t buf[4];
      store_from_float(buf, c.kv_dtype, 0, y);
      return static_cast<double>(load_as_float(buf, c.kv_dtype, 0)) * (fp8 ? scale : 1.0f);
    };
    const int kw = c.num_kv_heads * c.head_dim, vw = c.num_kv_heads * c.v_head_dim;
    for (int t = 0; t < len; ++t) {
      const size_t ut = static_cast<size_t>(t);
      if (t >= spec.prefix_len) {
        const size_t i = static_cast<size_t>(t - spec.prefix_len);
        for (int e = 0; e < kw; ++e) k[ut * kw + e] = cached(new_k_[static_cast<size_t>(r)][i * kw + e], c.k_scale);
        for (int e = 0; e < vw; ++e) v[ut * vw + e] = cached(new_v_[static_cast<size_t>(r)][i * vw + e], c.v_scale);
        continue;
      }
      const int64_t slot = row[t];
      const TensorView kb = kv_pool_->k_buffer(layer_.layer_id);
      const TensorView vb = kv_pool_->v_buffer(layer_.layer_id);
      for (int e = 0; e < kw; ++e) {
        k[ut * kw + e] = static_cast<double>(load_as_float(kb.data(), c.kv_dtype, static_cast<size_t>(slot * kw + e))) * (fp8 ? c.k_scale : 1.0);
      }
      for (int e = 0; e < vw; ++e) {
        v[ut * vw + e] = static_cast<double>(load_as_float(vb.data(), c.kv_dtype, static_cast<size_t>(slot * vw + e))) * (fp8 ? c.v_scale : 1.0);
      }
    }
    const auto& nq = new_q_[static_cast<size_t>(r)];
    std::vector<double> q(nq.begin(), nq.end());
    const std::vector<uint8_t> custom = c.tree_mask ? tree_masks_[static_cast<size_t>(r)] : std::vector<uint8_t>{};
    const auto mask = reference_mask(rules, spec.extend_len, len, spec.prefix_len, custom);
    std::vector<double> out, lse;
    if (c.dca_chunk_len > 0) {
      dual_chunk_reference<T>(rl, q, k, v, mask, spec, round_probs, out, lse);
    } else {
      reference_attention<T>(rl, q, k, v, mask, spec.extend_len, len, out, lse, round_probs);
    }
    for (double x : out) {
      uint8_t buf[4];
      store_from_float(buf, c.q_dtype, 0, static_cast<float>(x));
      result.out.push_back(std::is_same_v<T, double> ? x : load_as_float(buf, c.q_dtype, 0));
    }
    result.lse.insert(result.lse.end(), lse.begin(), lse.end());
  }
  return result;
}

// Dual chunk attention as its definition: each part (keys of the query's own chunk, of the chunk
// before, of earlier chunks) attended apart with its own rotary variant of q, at the request's
// long-context temperature, and the three merged by their log-sum-exps.
template <typename T>
void AttentionHarness::dual_chunk_reference(ReferenceLayer rl, const std::vector<double>& q, const std::vector<double>& k,
                                            const std::vector<double>& v, const std::vector<uint8_t>& mask,
                                            const RequestSpec& spec, bool round_probs, std::vector<double>& out,
                                            std::vector<double>& lse) const {
  const auto& c = config_;
  const int len = spec.prefix_len + spec.extend_len, q_len = spec.extend_len, D = c.head_dim, H = c.num_q_heads;
  if (c.dca_original_max > 0) {
    rl.scale *= std::max(1.0, 0.1 * std::log(static_cast<double>(len) / c.dca_original_max) + 1.0);
  }
  const size_t rows = static_cast<size_t>(q_len) * H;
  std::vector<std::vector<double>> outs(3), lses(3);
  for (int variant = 0; variant < 3; ++variant) {
    std::vector<double> qv(rows * D);
    for (size_t row = 0; row < rows; ++row) {
      const size_t variants = static_cast<size_t>(q_width() / c.head_dim);  // 3, or 5 with a sparse pattern
      std::copy_n(q.begin() + static_cast<int64_t>((row * variants + variant) * D), D, qv.begin() + static_cast<int64_t>(row * D));
    }
    std::vector<uint8_t> part = mask;
    for (int i = 0; i < q_len; ++i) {
      const int cq = (spec.prefix_len + i) / c.dca_chunk_len;
      for (int j = 0; j < len; ++j) {
        const int cj = j / c.dca_chunk_len;
        const int which = cj == cq ? 0 : cj + 1 == cq ? 1 : 2;
        if (which != variant) part[static_cast<size_t>(i) * len + j] = 0;
      }
    }
    reference_attention<T>(rl, qv, k, v, part, q_len, len, outs[variant], lses[variant], round_probs);
  }
  out.assign(rows * c.v_head_dim, 0.0);
  lse.assign(rows, -std::numeric_limits<double>::infinity());
  for (size_t row = 0; row < rows; ++row) {
    double top = -std::numeric_limits<double>::infinity();
    for (int p = 0; p < 3; ++p) top = std::max(top, lses[p][row]);
    if (top == -std::numeric_limits<double>::infinity()) continue;
    double z = 0;
    for (int p = 0; p < 3; ++p) z += std::exp(lses[p][row] - top);
    lse[row] = top + std::log(z);
    for (int p = 0; p < 3; ++p) {
      if (lses[p][row] == -std::numeric_limits<double>::infinity()) continue;
      const double w = std::exp(lses[p][row] - lse[row]);
      for (int d = 0; d < c.v_head_dim; ++d) out[row * c.v_head_dim + d] += w * outs[p][row * c.v_head_dim + d];
    }
  }
}

template AttentionResult AttentionHarness::reference<double>(const std::vector<int>&, bool) const;
template AttentionResult AttentionHarness::reference<float>(const std::vector<int>&, bool) const;

uint64_t fresh_seed() {
  static std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) | rd();
}

std::vector<RequestSpec> random_requests(std::mt19937& rng, int count, int max_prefix, int max_extend, ForwardMode mode) {
  std::vector<RequestSpec> reqs;
  for (int i = 0; i < count; ++i) {
    RequestSpec r;
    r.prefix_len = static_cast<int>(rng() % static_cast<unsigned>(max_prefix + 1));
    r.extend_len = mode == ForwardMode::DECODE ? 1 : 1 + static_cast<int>(rng() % static_cast<unsigned>(max_extend));
    reqs.push_back(r);
  }
  return reqs;
}

void expect_close_to_reference(const AttentionResult& got, const AttentionResult& truth, const AttentionResult& naive,
                               double atol, const char* what) {
  ASSERT_EQ(got.out.size(), truth.out.size()) << what;
  double err_got = 0, err_naive = 0;
  size_t worst = 0;
  for (size_t i = 0; i < truth.out.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got.out[i])) << what << ": output " << i << " is " << got.out[i];
    const double e = std::fabs(got.out[i] - truth.out[i]);
    if (e > err_got) {
      err_got = e;
      worst = i;
    }
    err_naive = std::max(err_naive, std::fabs(naive.out[i] - truth.out[i]));
  }
  EXPECT_TRUE(err_got <= 2 * err_naive + atol) << what << ": max error " << err_got << " at " << worst << " (got "
                                           << got.out[worst] << ", want " << truth.out[worst] << "), naive error "
                                           << err_naive;
  double lse_err = 0, lse_naive = 0;
  for (size_t i = 0; i < truth.lse.size(); ++i) {
    ASSERT_FALSE(std::isnan(got.lse[i])) << what << ": LSE " << i << " is NaN (never written?)";
    if (std::isinf(truth.lse[i])) {
      ASSERT_EQ(got.lse[i], truth.lse[i]) << what << ": LSE " << i;
      continue;
    }
    lse_err = std::max(lse_err, std::fabs(got.lse[i] - truth.lse[i]));
    lse_naive = std::max(lse_naive, std::fabs(naive.lse[i] - truth.lse[i]));
  }
  EXPECT_TRUE(lse_err <= 2 * lse_naive + 1e-4) << what << ": LSE error " << lse_err;
}

}  // namespace specula::testing
