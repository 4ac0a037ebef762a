#include "ds_harness.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "specula/batch/forward_batch.h"
#include "specula/kv/mha_kv_pool.h"
#include "specula/kv/req_to_token_pool.h"

namespace specula::testing {

namespace {

std::vector<float> rounded(size_t n, DType dtype, float lo, float hi, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  std::vector<char> tmp(n * dtype_size(dtype));
  convert_from_float(v.data(), tmp.data(), dtype, n);
  convert_to_float(tmp.data(), dtype, v.data(), n);
  return v;
}

Buffer to_tensor(const std::vector<float>& values, DType dtype, Device device, const Shape& shape) {
  Buffer host(dtype, shape);
  convert_from_float(values.data(), host.data(), dtype, values.size());
  if (device.is_cpu()) return host;
  Buffer dev(dtype, shape, device);
  copy(dev, host);
  return dev;
}

std::vector<double> to_doubles(const TensorView& t) {
  Buffer host(t.dtype(), t.shape());
  copy(host, t);
  std::vector<float> f(static_cast<size_t>(t.numel()));
  convert_to_float(host.data(), t.dtype(), f.data(), f.size());
  return {f.begin(), f.end()};
}

}  // namespace

DsHarness::DsHarness(const DsCase& c, uint64_t seed) : c_(c) {
  std::mt19937_64 rng(seed);
  const int H = c.num_kv_heads, D = c.head_dim, C = c.heavy_channel_num;
  config_ = std::make_shared<DoubleSparsityConfig>();
  config_->heavy_channel_num = C;
  config_->heavy_token_num = c.heavy_token_num;
  config_->sparse_decode_threshold = c.threshold;
  std::vector<int32_t>& channels = config_->channels.emplace_back();
  for (int h = 0; h < H; ++h) {
    std::vector<int32_t> all(static_cast<size_t>(D));
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    channels.insert(channels.end(), all.begin(), all.begin() + C);
  }
  layer_.layer_id = 0;
  layer_.num_q_heads = c.num_q_heads;
  layer_.num_kv_heads = H;
  layer_.head_dim = D;
  layer_.logit_cap = c.logit_cap;
  if (c.sinks) {
    std::normal_distribution<float> dist(0.5f, 1.5f);
    for (int h = 0; h < c.num_q_heads; ++h) layer_.sinks.push_back(dist(rng));
  }

  // Pages 1.. in a shuffled order, handed out request after request.
  int64_t pages = 0;
  for (int len : c.lens) pages += (len + c.page_size - 1) / c.page_size;
  std::vector<int32_t> order(static_cast<size_t>(pages));
  std::iota(order.begin(), order.end(), 1);
  std::shuffle(order.begin(), order.end(), rng);
  num_slots_ = (pages + 1) * c.page_size;
  size_t next = 0;
  for (int len : c.lens) {
    std::vector<int32_t>& slots = slots_.emplace_back(static_cast<size_t>(len));
    for (int t = 0; t < len; ++t) {
      if (t % c.page_size == 0) ++next;
      slots[static_cast<size_t>(t)] = order[next - 1] * c.page_size + t % c.page_size;
    }
    // Keys and values already rounded to both the query dtype (the prefill's inputs) and the cache.
    const DType narrow = dtype_size(c.kv_dtype) < dtype_size(c.q_dtype) ? c.kv_dtype : c.q_dtype;
    k_.push_back(rounded(static_cast<size_t>(len) * H * D, narrow, -1.0f, 1.0f, rng));
    v_.push_back(rounded(static_cast<size_t>(len) * H * D, narrow, -1.0f, 1.0f, rng));
    if (c.tied_labels) {
      for (int t = 0; t < len; ++t) {
        for (int h = 0; h < H; ++h) {
          for (int i = 0; i < C; ++i) {
            k_.back()[(static_cast<size_t>(t) * H + h) * D + static_cast<size_t>(channels[static_cast<size_t>(h * C + i)])] = 0.5f;
          }
        }
      }
    }
    if (c.label_groups > 0) {
      // Tokens 0 .. label_groups - 1 hold the groups' rows; every later token copies one.
      std::vector<float>& k = k_.back();
      for (int t = c.label_groups; t < len; ++t) {
        for (int h = 0; h < H; ++h) {
          const auto from = static_cast<size_t>(rng() % static_cast<uint64_t>(c.label_groups));
          for (int i = 0; i < C; ++i) {
            const auto d = static_cast<size_t>(channels[static_cast<size_t>(h * C + i)]);
            k[(static_cast<size_t>(t) * H + h) * D + d] = k[(from * H + static_cast<size_t>(h)) * D + d];
          }
        }
      }
    }
    prefill_q_.push_back(rounded(static_cast<size_t>(len - 1) * c.num_q_heads * D, c.q_dtype, -1.0f, 1.0f, rng));
  }
  decode_q_ = rounded(c.lens.size() * static_cast<size_t>(c.num_q_heads) * D, c.q_dtype, -1.5f, 1.5f, rng);
}

bool DsHarness::row_sparse(int request) const {
  const int len = c_.lens[static_cast<size_t>(request)];
  return len >= c_.threshold && len > c_.heavy_token_num;
}

bool DsHarness::any_sparse_row() const {
  for (size_t r = 0; r < c_.lens.size(); ++r) {
    if (row_sparse(static_cast<int>(r))) return true;
  }
  return false;
}

std::vector<double> DsHarness::label_scores(int request, int kv_head) const {
  const int H = c_.num_kv_heads, D = c_.head_dim, C = c_.heavy_channel_num, G = c_.num_q_heads / H;
  const int len = c_.lens[static_cast<size_t>(request)];
  const std::vector<int32_t>& ch = config_->channels[0];
  std::vector<double> scores(static_cast<size_t>(len), 0.0);
  for (int j = 0; j < len; ++j) {
    for (int g = 0; g < G; ++g) {
      const float* q = decode_q_.data() + (static_cast<size_t>(request) * c_.num_q_heads + kv_head * G + g) * D;
      for (int c = 0; c < C; ++c) {
        const int d = ch[static_cast<size_t>(kv_head * C + c)];
        scores[static_cast<size_t>(j)] += static_cast<double>(q[d]) * k_[static_cast<size_t>(request)][(static_cast<size_t>(j) * H + kv_head) * D + d];
      }
    }
  }
  return scores;
}

std::vector<int> DsHarness::chosen_keys(int request, int kv_head) const {
  const int len = c_.lens[static_cast<size_t>(request)];
  std::vector<int> keys(static_cast<size_t>(len));
  std::iota(keys.begin(), keys.end(), 0);
  if (!row_sparse(request)) return keys;
  const std::vector<double> s = label_scores(request, kv_head);
  std::stable_sort(keys.begin(), keys.end(), [&](int a, int b) { return s[static_cast<size_t>(a)] > s[static_cast<size_t>(b)]; });
  keys.resize(static_cast<size_t>(c_.heavy_token_num));
  return keys;
}

double DsHarness::selection_margin() const {
  if (c_.tied_labels) return INFINITY;  // exact ties, broken by position on every side
  double margin = INFINITY;
  for (size_t r = 0; r < c_.lens.size(); ++r) {
    if (!row_sparse(static_cast<int>(r))) continue;
    for (int h = 0; h < c_.num_kv_heads; ++h) {
      std::vector<double> s = label_scores(static_cast<int>(r), h);
      double top = 0.0;
      for (double x : s) top = std::max(top, std::abs(x));
      std::sort(s.begin(), s.end(), std::greater<>());
      const auto k = static_cast<size_t>(c_.heavy_token_num);
      const double last = s[k - 1];
      double gap = last - s[k];
      if (gap == 0.0) {
        // The count ends inside a group of equal scores: its distance to the nearest different
        // score on either side.
        gap = INFINITY;
        for (size_t i = k - 1; i-- > 0;) {
          if (s[i] != last) {
            gap = s[i] - last;
            break;
          }
        }
        for (size_t i = k; i < s.size(); ++i) {
          if (s[i] != last) {
            gap = std::min(gap, last - s[i]);
            break;
          }
        }
      }
      margin = std::min(margin, gap / std::max(top, 1e-30));
    }
  }
  return margin;
}

DsResult DsHarness::reference(bool all_keys) const {
  const int Hq = c_.num_q_heads, H = c_.num_kv_heads, D = c_.head_dim, G = Hq / H;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  DsResult res;
  res.out.assign(c_.lens.size() * static_cast<size_t>(Hq) * D, 0.0);
  res.lse.assign(c_.lens.size() * static_cast<size_t>(Hq), 0.0);
  for (size_t r = 0; r < c_.lens.size(); ++r) {
    for (int h = 0; h < H; ++h) {
      std::vector<int> keys = chosen_keys(static_cast<int>(r), h);
      if (all_keys) {
        keys.resize(static_cast<size_t>(c_.lens[r]));
        std::iota(keys.begin(), keys.end(), 0);
      }
      for (int g = 0; g < G; ++g) {
        const int hq = h * G + g;
        const float* q = decode_q_.data() + (r * Hq + static_cast<size_t>(hq)) * D;
        std::vector<double> logit(keys.size());
        double top = layer_.sinks.empty() ? -INFINITY : layer_.sinks[static_cast<size_t>(hq)];
        for (size_t i = 0; i < keys.size(); ++i) {
          const float* k = k_[r].data() + (static_cast<size_t>(keys[i]) * H + h) * D;
          double dot = 0.0;
          for (int d = 0; d < D; ++d) dot += static_cast<double>(q[d]) * k[d];
          double s = dot * scale;
          if (c_.logit_cap > 0.0f) s = c_.logit_cap * std::tanh(s / c_.logit_cap);
          logit[i] = s;
          top = std::max(top, s);
        }
        double denom = layer_.sinks.empty() ? 0.0 : std::exp(layer_.sinks[static_cast<size_t>(hq)] - top);
        for (double& l : logit) denom += (l = std::exp(l - top));
        double* o = res.out.data() + (r * Hq + static_cast<size_t>(hq)) * D;
        for (size_t i = 0; i < keys.size(); ++i) {
          const float* v = v_[r].data() + (static_cast<size_t>(keys[i]) * H + h) * D;
          for (int d = 0; d < D; ++d) o[d] += logit[i] / denom * v[d];
        }
        res.lse[r * Hq + static_cast<size_t>(hq)] = top + std::log(denom);
      }
    }
  }
  return res;
}

DsResult DsHarness::run(const std::string& backend_name, Device device) const {
  const int Hq = c_.num_q_heads, H = c_.num_kv_heads, D = c_.head_dim;
  const int n = static_cast<int>(c_.lens.size());
  const int longest = *std::max_element(c_.lens.begin(), c_.lens.end());
  AttentionBackendOptions options;
  options.device = device;
  options.page_size = c_.page_size;
  options.max_context_len = longest;
  options.double_sparsity = config_;
  auto backend = make_attention_backend(backend_name, options);
  backend->check_layer(layer_, c_.q_dtype, c_.kv_dtype);
  MHAKVPool pool(KVPoolConfig{num_slots_, 1, H, D, D, c_.kv_dtype, device});
  ReqToTokenPool rows(n, longest);

  ForwardBatch prefill;
  prefill.forward_mode = ForwardMode::EXTEND;
  prefill.batch_size = n;
  prefill.req_to_token_pool = &rows;
  prefill.token_to_kv_pool = &pool;
  std::vector<float> q, k, v;
  for (int r = 0; r < n; ++r) {
    const int len = c_.lens[static_cast<size_t>(r)];
    rows.write(r, 0, slots_[static_cast<size_t>(r)]);
    prefill.req_pool_indices.push_back(r);
    const int prefill_len = len - c_.decode_steps;
    prefill.seq_lens.push_back(prefill_len);
    prefill.extend_prefix_lens.push_back(0);
    prefill.extend_seq_lens.push_back(prefill_len);
    for (int t = 0; t < prefill_len; ++t) {
      prefill.out_cache_loc.push_back(slots_[static_cast<size_t>(r)][static_cast<size_t>(t)]);
      prefill.positions.push_back(t);
    }
    const auto& kr = k_[static_cast<size_t>(r)];
    const auto& vr = v_[static_cast<size_t>(r)];
    const size_t row = static_cast<size_t>(H) * D;
    const auto& qr = prefill_q_[static_cast<size_t>(r)];
    q.insert(q.end(), qr.begin(), qr.begin() + static_cast<std::ptrdiff_t>(prefill_len) * Hq * D);
    k.insert(k.end(), kr.begin(), kr.begin() + static_cast<std::ptrdiff_t>(prefill_len * row));
    v.insert(v.end(), vr.begin(), vr.begin() + static_cast<std::ptrdiff_t>(prefill_len * row));
  }
  // The caller's own cache write, before the backend runs (save_kv_cache = false).
  auto write_kv = [&](const ForwardBatch& b, const Buffer& kd, const Buffer& vd) {
    if (device.is_cpu()) {
      pool.set_kv_buffer(0, b.out_cache_loc, kd, vd);
      return;
    }
    Buffer loc_host(DType::i32, {b.num_tokens()});
    std::copy(b.out_cache_loc.begin(), b.out_cache_loc.end(), loc_host.data_as<int32_t>());
    Buffer loc(DType::i32, {b.num_tokens()}, device);
    copy(loc, loc_host);
    pool.set_kv_buffer(0, loc, kd, vd, nullptr);
  };
  ForwardOptions step_options;
  step_options.save_kv_cache = !c_.caller_writes_kv;
  const int64_t tokens = prefill.num_tokens();
  {
    Buffer qd = to_tensor(q, c_.q_dtype, device, {tokens, Hq, D});
    Buffer kd = to_tensor(k, c_.q_dtype, device, {tokens, H, D});
    Buffer vd = to_tensor(v, c_.q_dtype, device, {tokens, H, D});
    Buffer od(c_.q_dtype, {tokens, Hq, D}, device);
    if (c_.caller_writes_kv) write_kv(prefill, kd, vd);
    backend->init_forward_metadata(prefill);
    backend->forward(qd, kd, vd, od, layer_, prefill, step_options);
  }

  // Decode steps: back tokens before each request's last one (back = 0 is the checked step).
  DsResult result;
  for (int back = c_.decode_steps - 1; back >= 0; --back) {
    ForwardBatch decode;
    decode.forward_mode = ForwardMode::DECODE;
    decode.batch_size = n;
    decode.req_to_token_pool = &rows;
    decode.token_to_kv_pool = &pool;
    q.clear();
    k.clear();
    v.clear();
    for (int r = 0; r < n; ++r) {
      const int t = c_.lens[static_cast<size_t>(r)] - 1 - back;
      decode.req_pool_indices.push_back(r);
      decode.seq_lens.push_back(t + 1);
      decode.out_cache_loc.push_back(slots_[static_cast<size_t>(r)][static_cast<size_t>(t)]);
      decode.positions.push_back(t);
      const size_t row = static_cast<size_t>(H) * D;
      const auto at = [&](const std::vector<float>& x, size_t width) { return x.begin() + static_cast<std::ptrdiff_t>(t * width); };
      k.insert(k.end(), at(k_[static_cast<size_t>(r)], row), at(k_[static_cast<size_t>(r)], row) + static_cast<std::ptrdiff_t>(row));
      v.insert(v.end(), at(v_[static_cast<size_t>(r)], row), at(v_[static_cast<size_t>(r)], row) + static_cast<std::ptrdiff_t>(row));
      // Earlier steps' queries are prefill rows (any values do); the checked step's are decode_q_.
      if (back > 0) {
        const size_t qrow = static_cast<size_t>(Hq) * D;
        q.insert(q.end(), at(prefill_q_[static_cast<size_t>(r)], qrow), at(prefill_q_[static_cast<size_t>(r)], qrow) + static_cast<std::ptrdiff_t>(qrow));
      }
    }
    Buffer qd = to_tensor(back > 0 ? q : decode_q_, c_.q_dtype, device, {n, Hq, D});
    Buffer kd = to_tensor(k, c_.q_dtype, device, {n, H, D});
    Buffer vd = to_tensor(v, c_.q_dtype, device, {n, H, D});
    Buffer od(c_.q_dtype, {n, Hq, D}, device);
    Buffer lse(DType::f32, {n, Hq}, device);
    if (c_.caller_writes_kv) write_kv(decode, kd, vd);
    backend->init_forward_metadata(decode);
    ForwardOptions fo = step_options;
    fo.lse = lse;
    backend->forward(qd, kd, vd, od, layer_, decode, fo);
    if (back == 0) result = {to_doubles(od), to_doubles(lse)};
  }
  return result;
}

std::unique_ptr<DsHarness> harness_with_clear_choice(const DsCase& c, uint64_t& seed) {
  seed = std::random_device{}();
  for (int attempt = 0; attempt < 50; ++attempt, ++seed) {
    auto h = std::make_unique<DsHarness>(c, seed);
    if (h->selection_margin() >= c.min_margin) return h;
  }
  return nullptr;
}

double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0.0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return a.size() == b.size() ? m : INFINITY;
}

}  // namespace specula::testing
