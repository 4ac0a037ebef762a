#include "dual_chunk_fixture.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <span>

#include "specula/core/dtype.h"
#include "specula/kv/mha_kv_pool.h"
#include "specula/kv/req_to_token_pool.h"

namespace specula::test {

DcaRun run_dual_chunk_layer(const AttentionLayer& layer, ForwardMode mode,
                            const std::vector<std::pair<int, int>>& requests, int page_size, DType kv_dtype,
                            float q_scale, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  const int D = layer.head_dim, Hq = layer.num_q_heads, Hkv = layer.num_kv_heads, ps = page_size;
  const int width = layer.dca_q_variants() * D;
  const int n_req = static_cast<int>(requests.size());
  int longest = 1;
  int64_t pages = 0;
  for (auto [prefix, extend] : requests) {
    longest = std::max(longest, prefix + extend);
    pages += (prefix + extend + ps - 1) / ps;
  }
  MHAKVPool pool(KVPoolConfig{(pages + 1) * ps, 1, Hkv, D, D, kv_dtype, Device::cpu()});
  ReqToTokenPool rows(n_req, longest);
  AttentionBackendOptions options;
  options.page_size = ps;
  auto backend = make_attention_backend("cpu", options);
  backend->check_layer(layer, DType::f32, kv_dtype);
  auto cached = [&](float x) { return kv_dtype == DType::bf16 ? bf16_bits_to_float(float_to_bf16_bits(x)) : x; };

  std::vector<int32_t> order(static_cast<size_t>(pages));
  std::iota(order.begin(), order.end(), 1);
  std::shuffle(order.begin(), order.end(), rng);
  size_t next = 0;
  ForwardBatch batch;
  batch.forward_mode = mode;
  batch.batch_size = n_req;
  batch.req_to_token_pool = &rows;
  batch.token_to_kv_pool = &pool;
  DcaRun run;
  std::vector<float> k_new, v_new;
  for (int r = 0; r < n_req; ++r) {
    const auto [prefix, extend] = requests[static_cast<size_t>(r)];
    DcaRequest& rq = run.requests.emplace_back();
    rq.prefix = prefix;
    rq.len = prefix + extend;
    rq.first_row = static_cast<int64_t>(batch.positions.size());
    std::vector<int32_t> slots;
    for (int t = 0; t < rq.len; ++t) {
      if (t % ps == 0) ++next;
      slots.push_back(order[next - 1] * ps + t % ps);
    }
    rows.write(r, 0, slots);
    rq.keys.resize(static_cast<size_t>(rq.len) * Hkv * D);
    rq.values.resize(rq.keys.size());
    for (float& x : rq.keys) x = cached(unit(rng));
    for (float& x : rq.values) x = cached(unit(rng));
    if (prefix > 0) {
      pool.set_kv_buffer(0, std::span<const int32_t>(slots.data(), static_cast<size_t>(prefix)),
                         TensorView(rq.keys.data(), DType::f32, {prefix, Hkv, D}),
                         TensorView(rq.values.data(), DType::f32, {prefix, Hkv, D}));
    }
    batch.req_pool_indices.push_back(r);
    batch.seq_lens.push_back(rq.len);
    if (mode != ForwardMode::DECODE) {
      batch.extend_prefix_lens.push_back(prefix);
      batch.extend_seq_lens.push_back(extend);
    }
    for (int t = prefix; t < rq.len; ++t) {
      batch.out_cache_loc.push_back(slots[static_cast<size_t>(t)]);
      batch.positions.push_back(t);
      for (int i = 0; i < Hq * width; ++i) run.q.push_back(unit(rng) * q_scale);
      const auto at = static_cast<int64_t>(t) * Hkv * D;
      k_new.insert(k_new.end(), rq.keys.begin() + at, rq.keys.begin() + at + Hkv * D);
      v_new.insert(v_new.end(), rq.values.begin() + at, rq.values.begin() + at + Hkv * D);
    }
  }
  const int64_t n = batch.num_tokens();
  run.out.resize(static_cast<size_t>(n) * Hq * D);
  run.lse.resize(static_cast<size_t>(n) * Hq);
  ForwardOptions fo;
  fo.lse = TensorView(run.lse.data(), DType::f32, {n, Hq});
  backend->init_forward_metadata(batch);
  backend->forward(TensorView(run.q.data(), DType::f32, {n, Hq, width}), TensorView(k_new.data(), DType::f32, {n, Hkv, D}),
                   TensorView(v_new.data(), DType::f32, {n, Hkv, D}), TensorView(run.out.data(), DType::f32, {n, Hq, D}),
                   layer, batch, fo);
  return run;
}

DcaPart attend_keys(const std::vector<double>& logits, const std::vector<int>& keys, const DcaRequest& r, int kv_head,
                    int num_kv_heads, int head_dim) {
  const double m = *std::max_element(logits.begin(), logits.end());
  double z = 0;
  for (double x : logits) z += std::exp(x - m);
  DcaPart part{m + std::log(z), std::vector<double>(static_cast<size_t>(head_dim), 0.0)};
  for (size_t i = 0; i < keys.size(); ++i) {
    const double p = std::exp(logits[i] - m) / z;
    const float* v = r.values.data() + (static_cast<size_t>(keys[i]) * num_kv_heads + kv_head) * head_dim;
    for (int d = 0; d < head_dim; ++d) part.out[static_cast<size_t>(d)] += p * v[d];
  }
  return part;
}

DcaPart merge_parts(const std::vector<DcaPart>& parts, int head_dim) {
  double m = -INFINITY;
  for (const DcaPart& p : parts) m = std::max(m, p.lse);
  double z = 0;
  for (const DcaPart& p : parts) z += std::exp(p.lse - m);
  DcaPart merged{m + std::log(z), std::vector<double>(static_cast<size_t>(head_dim), 0.0)};
  for (const DcaPart& p : parts) {
    const double w = std::exp(p.lse - merged.lse);
    for (int d = 0; d < head_dim; ++d) merged.out[static_cast<size_t>(d)] += w * p.out[static_cast<size_t>(d)];
  }
  return merged;
}

}  // namespace specula::test
