// MlaFixture: random paged MLA batches and the float64 reference.
#include "mla_fixture.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "specula/core/error.h"

#ifdef SPECULA_HAS_CUDA
#include <cuda_runtime_api.h>
#endif

namespace specula::testing {

namespace {

void round_to(DType dtype, std::vector<float>& v) {
  if (dtype == DType::f32) return;
  std::vector<uint8_t> tmp(v.size() * dtype_size(dtype));
  convert_from_float(v.data(), tmp.data(), dtype, v.size());
  convert_to_float(tmp.data(), dtype, v.data(), v.size());
}

// A Buffer of `dtype` on `device` holding host floats (converted) or raw host bytes.
Buffer to_device(const std::vector<float>& v, DType dtype, Shape shape, Device device) {
  Buffer host(dtype, shape);
  convert_from_float(v.data(), host.data(), dtype, v.size());
  if (device.is_cpu()) return host;
  Buffer dev(dtype, shape, device);
  copy(dev, host);
  return dev;
}

Buffer ints_to_device(const std::vector<int32_t>& v, Shape shape, Device device) {
  Buffer host(DType::i32, shape);
  std::copy(v.begin(), v.end(), host.data_as<int32_t>());
  if (device.is_cpu()) return host;
  Buffer dev(DType::i32, shape, device);
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

void write_rows(MLAKVPool& pool, int layer, const std::vector<int32_t>& loc, const std::vector<float>& kv_c,
                const std::vector<float>& k_pe, Device device) {
  const auto n = static_cast<int64_t>(loc.size());
  if (n == 0) return;
  const Buffer c = to_device(kv_c, DType::f32, {n, pool.kv_lora_rank()}, device);
  const Buffer p = to_device(k_pe, DType::f32, {n, pool.qk_rope_head_dim()}, device);
  if (device.is_cpu()) {
    pool.set_mla_kv_buffer(layer, loc, c, p);
    return;
  }
  const Buffer l = ints_to_device(loc, {n}, device);
  pool.set_mla_kv_buffer(layer, l, c, p, nullptr);
#ifdef SPECULA_HAS_CUDA
  cudaDeviceSynchronize();
#endif
}

}  // namespace

std::vector<int> random_lens(std::mt19937_64& rng, int n, int lo, int hi) {
  std::vector<int> v;
  for (int i = 0; i < n; ++i) v.push_back(std::uniform_int_distribution<int>(lo, hi)(rng));
  return v;
}

MlaFixture::MlaFixture(const MlaCase& c, Device device, uint64_t seed) : case_(c), device_(device), rng_(seed) {
  const int bs = static_cast<int>(c.prefix_lens.size());
  SPECULA_REQUIRE(static_cast<int>(c.extend_lens.size()) == bs, "prefix_lens and extend_lens differ in size");
  layer_.layer_id = 1;
  layer_.num_q_heads = c.num_q_heads;
  layer_.kv_lora_rank = c.kv_lora_rank;
  layer_.qk_rope_head_dim = c.qk_rope_head_dim;
  // DeepSeek's scale: 1/sqrt(qk_nope_head_dim 128 + rope 64), not the absorbed width.
  layer_.scaling = 1.0f / std::sqrt(192.0f);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  if (c.sinks) {
    for (int h = 0; h < c.num_q_heads; ++h) layer_.sinks.push_back(normal(rng_) * 2.0f);
  }
  const int ps = c.page_size;
  int max_len = 1;
  int64_t pages = 0;
  for (int i = 0; i < bs; ++i) {
    kv_lens_.push_back(c.prefix_lens[static_cast<size_t>(i)] + c.extend_lens[static_cast<size_t>(i)]);
    max_len = std::max(max_len, kv_lens_.back());
    pages += (kv_lens_.back() + ps - 1) / ps;
  }
  // Spare pages, shuffled, so requests' pages interleave and never start at slot 0.
  std::vector<int32_t> page_ids(static_cast<size_t>(pages + 3));
  std::iota(page_ids.begin(), page_ids.end(), 1);
  std::shuffle(page_ids.begin(), page_ids.end(), rng_);
  MLAKVPoolConfig pc;
  pc.num_slots = (static_cast<int64_t>(page_ids.size()) + 1) * ps;
  pc.num_layers = 2;
  pc.kv_lora_rank = c.kv_lora_rank;
  pc.qk_rope_head_dim = c.qk_rope_head_dim;
  pc.format = c.format;
  pc.device = device;
  pool_ = std::make_unique<MLAKVPool>(pc);
  // Slots no request writes (the tails of last pages, the spare pages) hold NaN bytes, as a reused
  // pool may: no kernel may let them into a result (0 * NaN is NaN).
  {
    const TensorView kv = pool_->kv_buffer(layer_.layer_id);
    std::vector<uint8_t> nan_bytes(kv.nbytes(), 0xFF);
    copy(kv, TensorView(nan_bytes.data(), kv.dtype(), kv.shape()));
  }
  req_pool_ = std::make_unique<ReqToTokenPool>(bs + 2, max_len + ps);

  batch_.forward_mode = c.mode;
  batch_.batch_size = bs;
  batch_.req_to_token_pool = req_pool_.get();
  batch_.mla_kv_pool = pool_.get();
  if (c.mode == ForwardMode::TARGET_VERIFY) {
    spec_ = std::make_shared<SpecInfo>();
    spec_->num_draft_tokens = c.extend_lens.empty() ? 1 : c.extend_lens[0];
    spec_->prefix_visible = c.tree_mask;
    batch_.spec_info = spec_;
  }
  size_t next_page = 0;
  std::vector<int32_t> prefix_loc;
  std::vector<float> prefix_c, prefix_pe;
  const int R = c.kv_lora_rank;
  const int P = c.qk_rope_head_dim;
  const int D = R + P;
  const auto req_rows = req_pool_->alloc(bs).value();
  for (int i = 0; i < bs; ++i) {
    const auto ui = static_cast<size_t>(i);
    const int32_t kv_len = kv_lens_[ui];
    const int32_t prefix = c.prefix_lens[ui];
    const int32_t extend = c.extend_lens[ui];
    std::vector<int32_t> slots(static_cast<size_t>(kv_len));
    for (int32_t j = 0; j < kv_len; ++j) {
      if (j % ps == 0) ++next_page;
      slots[static_cast<size_t>(j)] = page_ids[next_page - 1] * ps + j % ps;
    }
    req_pool_->write(req_rows[ui], 0, slots);
    batch_.req_pool_indices.push_back(req_rows[ui]);
    switch (c.mode) {
      case ForwardMode::DECODE: SPECULA_REQUIRE(extend == 1, "DECODE needs extend 1"); batch_.seq_lens.push_back(kv_len); break;
      case ForwardMode::TARGET_VERIFY: batch_.seq_lens.push_back(prefix); break;
      default:
        batch_.seq_lens.push_back(kv_len);
        batch_.extend_prefix_lens.push_back(prefix);
        batch_.extend_seq_lens.push_back(extend);
    }
    for (int32_t j = 0; j < prefix; ++j) {
      prefix_loc.push_back(slots[static_cast<size_t>(j)]);
      for (int d = 0; d < R; ++d) prefix_c.push_back(normal(rng_));
      for (int d = 0; d < P; ++d) prefix_pe.push_back(normal(rng_));
    }
    for (int32_t j = prefix; j < kv_len; ++j) {
      batch_.out_cache_loc.push_back(slots[static_cast<size_t>(j)]);
      batch_.input_ids.push_back(1);
      batch_.positions.push_back(j);
      token_req_.push_back(i);
      token_pos_.push_back(j);
    }
    if (c.tree_mask) {
      SPECULA_REQUIRE(c.mode == ForwardMode::TARGET_VERIFY, "tree masks are for TARGET_VERIFY");
      // Draft 0 is the root; every other draft token hangs under a random earlier one and sees
      // the prefix, its ancestors and itself.
      std::vector<int> parent(static_cast<size_t>(extend), -1);
      std::vector<uint8_t> m(static_cast<size_t>(extend) * static_cast<size_t>(kv_len), 0);
      for (int a = 0; a < extend; ++a) {
        if (a > 0) parent[static_cast<size_t>(a)] = std::uniform_int_distribution<int>(0, a - 1)(rng_);
        uint8_t* row = m.data() + static_cast<size_t>(a) * static_cast<size_t>(kv_len);
        std::fill(row, row + prefix, 1);
        for (int b = a; b >= 0; b = parent[static_cast<size_t>(b)]) row[prefix + b] = 1;
      }
      spec_->custom_mask.insert(spec_->custom_mask.end(), m.begin(), m.end());
      masks_.push_back(std::move(m));
    }
  }
  write_rows(*pool_, layer_.layer_id, prefix_loc, prefix_c, prefix_pe, device);

  const int64_t n = num_tokens();
  q_.resize(static_cast<size_t>(n * c.num_q_heads * D));
  for (float& x : q_) x = normal(rng_);
  round_to(c.q_dtype, q_);
  kv_c_.resize(static_cast<size_t>(n * R));
  k_pe_.resize(static_cast<size_t>(n * P));
  for (float& x : kv_c_) x = normal(rng_);
  for (float& x : k_pe_) x = normal(rng_);

  if (c.topk > 0) {
    topk_indices_.assign(static_cast<size_t>(n * c.topk), -1);
    for (int64_t t = 0; t < n; ++t) {
      const int32_t kv_len = kv_lens_[static_cast<size_t>(token_req_[static_cast<size_t>(t)])];
      std::vector<int32_t> pos(static_cast<size_t>(kv_len));
      std::iota(pos.begin(), pos.end(), 0);
      std::shuffle(pos.begin(), pos.end(), rng_);
      const int most = std::min(c.topk, kv_len);
      // Mostly partly filled rows; sometimes none at all, sometimes an index past the request.
      const int count = std::uniform_int_distribution<int>(0, 9)(rng_) == 0
                            ? 0
                            : std::uniform_int_distribution<int>(1, most)(rng_);
      int32_t* row = topk_indices_.data() + t * c.topk;
      for (int k = 0; k < count; ++k) row[k] = pos[static_cast<size_t>(k)];
      if (count < c.topk && std::uniform_int_distribution<int>(0, 3)(rng_) == 0) row[count] = kv_len + 5;
      std::shuffle(row, row + c.topk, rng_);
    }
  }
}

MlaBackendOptions MlaFixture::backend_options() const {
  MlaBackendOptions o;
  o.device = device_;
  o.page_size = case_.page_size;
  o.prefix_chunk_tokens = case_.prefix_chunk_tokens;
  o.extend_form = case_.extend_form;
  o.expanded_chunk_rows = case_.expanded_chunk_rows;
  int max_len = 1;
  for (int32_t l : kv_lens_) max_len = std::max(max_len, l);
  o.max_context_len = max_len + case_.page_size;
  return o;
}

std::vector<int32_t> MlaFixture::visible(int64_t t) const {
  const auto r = static_cast<size_t>(token_req_[static_cast<size_t>(t)]);
  const int32_t kv_len = kv_lens_[r];
  const int32_t pos = token_pos_[static_cast<size_t>(t)];
  std::vector<int32_t> out;
  if (case_.topk > 0) {
    for (int k = 0; k < case_.topk; ++k) {
      const int32_t j = topk_indices_[static_cast<size_t>(t * case_.topk + k)];
      if (j >= 0 && j < kv_len) out.push_back(j);
    }
    return out;
  }
  if (case_.tree_mask) {
    const int32_t row = pos - case_.prefix_lens[r];
    const uint8_t* m = masks_[r].data() + static_cast<size_t>(row) * static_cast<size_t>(kv_len);
    for (int32_t j = 0; j < kv_len; ++j) {
      if (m[j] != 0) out.push_back(j);
    }
    return out;
  }
  for (int32_t j = 0; j <= pos; ++j) out.push_back(j);
  return out;
}

MlaFixture::StepTensors MlaFixture::step_tensors() const {
  const int64_t n = num_tokens();
  const int H = case_.num_q_heads;
  const int R = case_.kv_lora_rank;
  const int P = case_.qk_rope_head_dim;
  StepTensors t;
  t.q = to_device(q_, case_.q_dtype, {n, H, R + P}, device_);
  t.kv_c = to_device(kv_c_, DType::f32, {n, R}, device_);
  t.k_pe = to_device(k_pe_, DType::f32, {n, P}, device_);
  t.out = Buffer(case_.q_dtype, {n, H, R}, device_);
  t.lse = Buffer(DType::f32, {n, H}, device_);
  t.out.zero();
  t.lse.zero();
  t.options.lse = t.lse;
  if (case_.topk > 0) {
    t.topk = ints_to_device(topk_indices_, {n, case_.topk}, device_);
    t.options.topk_indices = t.topk;
  }
  return t;
}

MlaResult MlaFixture::run(MlaAttentionBackend& backend) {
  const StepTensors t = step_tensors();
  const Buffer &q = t.q, &kv_c = t.kv_c, &k_pe = t.k_pe, &out = t.out, &lse = t.lse;
  const MlaForwardOptions& options = t.options;
  backend.check_layer(layer_, case_.q_dtype, case_.format);
  backend.init_forward_metadata(batch_);
  backend.forward(q, kv_c, k_pe, out, layer_, batch_, options);
#ifdef SPECULA_HAS_CUDA
  if (device_.is_cuda()) cudaDeviceSynchronize();
#endif
  return {to_doubles(out), to_doubles(lse), {}};
}

MlaResult MlaFixture::run_graph(MlaAttentionBackend& backend, void* stream) {
#ifdef SPECULA_HAS_CUDA
  const int64_t n = num_tokens();
  const StepTensors t = step_tensors();
  const Buffer &q = t.q, &kv_c = t.kv_c, &k_pe = t.k_pe, &out = t.out, &lse = t.lse;
  const MlaForwardOptions& options = t.options;
  auto s = static_cast<cudaStream_t>(stream);
  backend.check_layer(layer_, case_.q_dtype, case_.format);
  backend.init_cuda_graph_state(batch_.batch_size, static_cast<int>(n));
  backend.init_forward_metadata_capture_cuda_graph(batch_);
  cudaStreamSynchronize(s);
  cudaGraph_t graph = nullptr;
  SPECULA_REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess, "begin capture");
  backend.forward(q, kv_c, k_pe, out, layer_, batch_, options);
  SPECULA_REQUIRE(cudaStreamEndCapture(s, &graph) == cudaSuccess, "end capture");
  cudaGraphExec_t exec = nullptr;
  SPECULA_REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess, "instantiate");
  // Nothing ran during capture: poison the outputs, then replay after the replay hook.
  cudaMemsetAsync(out.data(), 0xff, out.nbytes(), s);
  backend.init_forward_metadata_replay_cuda_graph(batch_);
  SPECULA_REQUIRE(cudaGraphLaunch(exec, s) == cudaSuccess, "graph launch");
  SPECULA_REQUIRE(cudaStreamSynchronize(s) == cudaSuccess, "graph run");
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return {to_doubles(out), to_doubles(lse), {}};
#else
  (void)backend;
  (void)stream;
  SPECULA_REQUIRE(false, "run_graph needs CUDA");
  return {};
#endif
}

ExpandedInputs MlaFixture::make_expanded() {
  constexpr int kNope = 128;
  const int64_t n = num_tokens();
  const int H = case_.num_q_heads;
  const int R = case_.kv_lora_rank;
  const int D = R + case_.qk_rope_head_dim;
  SPECULA_REQUIRE(layer_.qk_nope_head_dim == kNope && layer_.v_head_dim == kNope, "the fixture expands at 128 / 128");
  // Weights of variance 1 / R keep the expanded keys and values at the latent rows' scale.
  std::normal_distribution<float> w(0.0f, 1.0f / std::sqrt(static_cast<float>(R)));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  ExpandedInputs e;
  e.w_uk.resize(static_cast<size_t>(H) * kNope * R);
  e.w_uv.resize(e.w_uk.size());
  for (float& x : e.w_uk) x = w(rng_);
  for (float& x : e.w_uv) x = w(rng_);
  e.q_nope.resize(static_cast<size_t>(n * H * kNope));
  for (float& x : e.q_nope) x = normal(rng_);
  round_to(DType::bf16, e.q_nope);
  for (int64_t t = 0; t < n; ++t) {
    for (int h = 0; h < H; ++h) {
      float* q = q_.data() + (t * H + h) * D;
      const float* qn = e.q_nope.data() + (t * H + h) * kNope;
      for (int c = 0; c < R; ++c) {
        double dot = 0.0;
        for (int d = 0; d < kNope; ++d) dot += static_cast<double>(qn[d]) * e.w_uk[(static_cast<size_t>(h) * kNope + d) * R + c];
        q[c] = static_cast<float>(dot);
      }
    }
  }
  return e;
}

MlaResult MlaFixture::run_expanded(MlaAttentionBackend& backend, const ExpandedInputs& e) {
#ifdef SPECULA_HAS_CUDA
  constexpr int kNope = 128;
  const int64_t n = num_tokens();
  const int H = case_.num_q_heads;
  const int R = case_.kv_lora_rank;
  const int P = case_.qk_rope_head_dim;
  const int D = R + P;
  const StepTensors t = step_tensors();
  std::vector<float> q(static_cast<size_t>(n * H * (kNope + P)));
  for (int64_t r = 0; r < n * H; ++r) {
    std::copy_n(e.q_nope.data() + r * kNope, kNope, q.data() + r * (kNope + P));
    std::copy_n(q_.data() + r * D + R, P, q.data() + r * (kNope + P) + kNope);
  }
  const Buffer q_dev = to_device(q, DType::bf16, {n, H, kNope + P}, device_);
  Buffer out(DType::bf16, {n, H, kNope}, device_);
  out.zero();
  const MlaExpandFn expand = [&](const void* kv_c, const void* k_pe, int64_t rows, void* k, void* v) {
    SPECULA_REQUIRE(cudaDeviceSynchronize() == cudaSuccess, "gather");
    const std::vector<double> c = to_doubles(TensorView(const_cast<void*>(kv_c), DType::bf16, {rows, R}, device_));
    const std::vector<double> pe = to_doubles(TensorView(const_cast<void*>(k_pe), DType::bf16, {rows, P}, device_));
    std::vector<float> kh(static_cast<size_t>(rows * H * (kNope + P))), vh(static_cast<size_t>(rows * H * kNope));
    for (int64_t r = 0; r < rows; ++r) {
      const double* lat = c.data() + r * R;
      for (int h = 0; h < H; ++h) {
        float* kr = kh.data() + (r * H + h) * (kNope + P);
        float* vr = vh.data() + (r * H + h) * kNope;
        for (int d = 0; d < kNope; ++d) {
          const float* wk = e.w_uk.data() + (static_cast<size_t>(h) * kNope + d) * R;
          const float* wv = e.w_uv.data() + (static_cast<size_t>(h) * kNope + d) * R;
          double dk = 0.0, dv = 0.0;
          for (int x = 0; x < R; ++x) {
            dk += static_cast<double>(wk[x]) * lat[x];
            dv += static_cast<double>(wv[x]) * lat[x];
          }
          kr[d] = static_cast<float>(dk);
          vr[d] = static_cast<float>(dv);
        }
        for (int d = 0; d < P; ++d) kr[kNope + d] = static_cast<float>(pe[static_cast<size_t>(r * P + d)]);
      }
    }
    const Buffer kd = to_device(kh, DType::bf16, {rows, H, kNope + P}, device_);
    const Buffer vd = to_device(vh, DType::bf16, {rows, H, kNope}, device_);
    cudaMemcpy(k, kd.data(), kd.nbytes(), cudaMemcpyDeviceToDevice);
    cudaMemcpy(v, vd.data(), vd.nbytes(), cudaMemcpyDeviceToDevice);
  };
  backend.check_layer(layer_, DType::bf16, case_.format);
  backend.init_forward_metadata(batch_);
  SPECULA_REQUIRE(backend.expanded_step(), "the backend did not plan this step in the expanded form");
  backend.forward_expanded(q_dev, t.kv_c, t.k_pe, out, layer_, batch_, expand, t.options);
  SPECULA_REQUIRE(cudaDeviceSynchronize() == cudaSuccess, "forward_expanded");
  return {to_doubles(out), to_doubles(t.lse), {}};
#else
  (void)backend;
  (void)e;
  SPECULA_REQUIRE(false, "run_expanded needs CUDA");
  return {};
#endif
}

MlaResult MlaFixture::reference_expanded(const ExpandedInputs& e) const {
  constexpr int kNope = 128;
  const int64_t n = num_tokens();
  const int H = case_.num_q_heads;
  const int R = case_.kv_lora_rank;
  MlaResult latent = reference();
  MlaResult res;
  res.lse = latent.lse;
  res.out.assign(static_cast<size_t>(n * H * kNope), 0.0);
  for (int64_t r = 0; r < n * H; ++r) {
    const auto h = static_cast<size_t>(r % H);
    for (int d = 0; d < kNope; ++d) {
      double acc = 0.0;
      for (int x = 0; x < R; ++x) acc += e.w_uv[(h * kNope + d) * R + x] * latent.out[static_cast<size_t>(r * R + x)];
      res.out[static_cast<size_t>(r * kNope + d)] = acc;
    }
  }
  return res;
}

MlaResult MlaFixture::reference(bool bf16_operands) const {
  const int64_t n = num_tokens();
  const int H = case_.num_q_heads;
  const int R = case_.kv_lora_rank;
  const int D = R + case_.qk_rope_head_dim;
  MlaResult res;
  res.out.assign(static_cast<size_t>(n * H * R), 0.0);
  res.magnitude.assign(static_cast<size_t>(n * H * R), 0.0);
  res.lse.assign(static_cast<size_t>(n * H), -std::numeric_limits<double>::infinity());
  std::vector<std::vector<float>> rows(kv_lens_.size());
  for (size_t r = 0; r < kv_lens_.size(); ++r) {
    rows[r].resize(static_cast<size_t>(kv_lens_[r]) * static_cast<size_t>(D));
    const int32_t* slots = req_pool_->row(batch_.req_pool_indices[r]);
    pool_->read_rows(layer_.layer_id, std::span<const int32_t>(slots, static_cast<size_t>(kv_lens_[r])), rows[r].data());
    if (bf16_operands) round_to(DType::bf16, rows[r]);
  }
  for (int64_t t = 0; t < n; ++t) {
    const std::vector<int32_t> keys = visible(t);
    const std::vector<float>& req_rows = rows[static_cast<size_t>(token_req_[static_cast<size_t>(t)])];
    for (int h = 0; h < H; ++h) {
      const float* q = q_.data() + (t * H + h) * D;
      std::vector<double> s(keys.size());
      double m = -std::numeric_limits<double>::infinity();
      for (size_t i = 0; i < keys.size(); ++i) {
        const float* k = req_rows.data() + static_cast<size_t>(keys[i]) * static_cast<size_t>(D);
        double dot = 0.0;
        for (int d = 0; d < D; ++d) dot += static_cast<double>(q[d]) * k[d];
        s[i] = dot * static_cast<double>(layer_.scaling);
        m = std::max(m, s[i]);
      }
      if (!layer_.sinks.empty()) m = std::max(m, static_cast<double>(layer_.sinks[static_cast<size_t>(h)]));
      if (std::isinf(m)) continue;  // no keys, no sink: zeros and -inf
      double total = layer_.sinks.empty() ? 0.0 : std::exp(layer_.sinks[static_cast<size_t>(h)] - m);
      double* o = res.out.data() + (t * H + h) * R;
      double* mag = res.magnitude.data() + (t * H + h) * R;
      for (size_t i = 0; i < keys.size(); ++i) {
        const double p = std::exp(s[i] - m);
        total += p;
        const float* v = req_rows.data() + static_cast<size_t>(keys[i]) * static_cast<size_t>(D);
        for (int d = 0; d < R; ++d) {
          o[d] += p * v[d];
          mag[d] += p * std::abs(v[d]);
        }
      }
      for (int d = 0; d < R; ++d) {
        o[d] /= total;
        mag[d] /= total;
      }
      res.lse[static_cast<size_t>(t * H + h)] = m + std::log(total);
    }
  }
  return res;
}

}  // namespace specula::testing
