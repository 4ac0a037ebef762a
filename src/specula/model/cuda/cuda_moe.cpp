// CudaMoe: the expert upload (one expert at a time, into the stacked bf16 layouts) and the
// layer's launches.
#include "specula/model/cuda/cuda_moe.h"

#include <algorithm>
#include <vector>

#include "specula/core/cuda_check.h"
#include "specula/core/dtype.h"
#include "specula/core/error.h"
#include "specula/model/cuda/cuda_linear.h"
#include "specula/model/cuda/decoder_layer.h"
#include "specula/model/cuda/model_ops.h"
#include "specula/model/cuda/moe_kernels.h"
#include "specula/model/fp8_weights.h"

namespace specula {

namespace ck = cuda_kernels;

namespace {

constexpr int kInterleave = 32;  // gate and up rows alternate in runs of this many

// A matrix as bf16 bits, rounded to nearest even from any stored type.
std::vector<uint16_t> to_bf16(const void* data, DType dtype, size_t count) {
  std::vector<uint16_t> bits(count);
  if (dtype == DType::bf16) {
    std::copy_n(static_cast<const uint16_t*>(data), count, bits.data());
    return bits;
  }
  if (dtype == DType::f32) {
    convert_from_float(static_cast<const float*>(data), bits.data(), DType::bf16, count);
    return bits;
  }
  std::vector<float> f(count);
  convert_to_float(data, dtype, f.data(), count);
  convert_from_float(f.data(), bits.data(), DType::bf16, count);
  return bits;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& v) { return to_bf16(v.data(), DType::f32, v.size()); }

// The rows of the largest block list any tile can make of `pairs` pairs (moe_pick_tile changes
// the tile with the batch; a CUDA graph's frozen workspace must hold every batch it replays).
int64_t max_rows(int64_t pairs, int experts) {
  int64_t rows = 0;
  for (ck::MoeTile t : {ck::MoeTile::kSmall, ck::MoeTile::kMedium, ck::MoeTile::kLarge}) {
    const int bm = ck::moe_tile_rows(t);
    rows = std::max(rows, ck::moe_max_blocks(pairs, experts, bm) * bm);
  }
  return rows;
}

}  // namespace

CudaMoe::CudaMoe(const MoeConfig& config, const MoeWeights& host, const WeightSource* source, const std::string& prefix,
                 int hidden, Device device, bool keep_fp8)
    : config_(config), hidden_(hidden), inter_(config.moe_intermediate_size) {
  const int E = config.n_routed_experts;
  SPECULA_CHECK(hidden % 8 == 0 && inter_ % 8 == 0,
                "mixture-of-experts layers on the GPU need hidden_size and moe_intermediate_size multiples of 8, not {} "
                "and {}",
                hidden, inter_);
  SPECULA_CHECK(E + config.n_shared_experts <= ck::kMaxRouteExperts && config.n_group <= ck::kMaxRouteGroups,
                "mixture-of-experts layers on the GPU route over at most {} experts (shared ones included) in {} "
                "groups, not {} + {} in {}",
                ck::kMaxRouteExperts, ck::kMaxRouteGroups, E, config.n_shared_experts, config.n_group);
  SPECULA_CHECK(config.num_experts_per_tok + config.n_shared_experts <= ck::kMaxMoeTokenExperts,
                "mixture-of-experts layers on the GPU take at most {} experts per token (top-k and shared), not {} + {}",
                ck::kMaxMoeTokenExperts, config.num_experts_per_tok, config.n_shared_experts);
  SPECULA_CHECK(host.experts.size() == static_cast<size_t>(E) || source != nullptr,
                "CudaMoe: the routed experts are neither loaded nor readable");
  inter_padded_ = (inter_ + kInterleave - 1) / kInterleave * kInterleave;
  router_ = upload_weight(host.router, device);
  bias_ = upload_f32(host.correction_bias, device);
  shared_ = config.n_shared_experts;
  SPECULA_CHECK(shared_ == 0 || host.shared.inter == shared_ * inter_,
                "CudaMoe: {} shared experts of {} in one MLP of {}", shared_, inter_, host.shared.inter);
  const bool loaded = host.experts.size() == static_cast<size_t>(E);
  const auto* fp8 = dynamic_cast<const Fp8BlockWeights*>(source);
  if (!loaded && keep_fp8 && fp8 != nullptr) upload_fp8(*fp8, prefix, device);
  if (fp8_) return;
  const int64_t Ip = inter_padded_, h = hidden;
  const int64_t stacked = E + shared_;
  w_gate_up_ = Buffer(DType::bf16, {stacked, 2 * Ip, h}, device);
  w_down_ = Buffer(DType::bf16, {stacked, h, Ip}, device);
  std::vector<uint16_t> gate_up(static_cast<size_t>(2 * Ip * h)), down(static_cast<size_t>(h * Ip));
  // Expert e's gate, up [inter, hidden] and down [hidden, inter] into slot e of the layouts.
  auto place = [&](int64_t e, const uint16_t* g, const uint16_t* u, const uint16_t* d, int64_t d_stride) {
    std::fill(gate_up.begin(), gate_up.end(), uint16_t{0});
    for (int64_t r = 0; r < inter_; ++r) {
      std::copy_n(g + r * h, h, gate_up.data() + gate_row(r) * h);
      std::copy_n(u + r * h, h, gate_up.data() + (gate_row(r) + kInterleave) * h);
    }
    std::fill(down.begin(), down.end(), uint16_t{0});
    for (int64_t r = 0; r < h; ++r) std::copy_n(d + r * d_stride, inter_, down.data() + r * Ip);
    CUDA_CHECK(cudaMemcpy(static_cast<uint16_t*>(w_gate_up_.data()) + e * 2 * Ip * h, gate_up.data(),
                          gate_up.size() * sizeof(uint16_t), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(static_cast<uint16_t*>(w_down_.data()) + e * h * Ip, down.data(), down.size() * sizeof(uint16_t),
                          cudaMemcpyHostToDevice));
  };
  for (int e = 0; e < E; ++e) {
    std::vector<uint16_t> g, u, d;
    if (loaded) {
      const ExpertWeights& x = host.experts[static_cast<size_t>(e)];
      g = to_bf16(x.w_gate), u = to_bf16(x.w_up), d = to_bf16(x.w_down);
    } else {
      const ExpertNames names = expert_names(prefix, config, e);
      // A synthetic source's view lives until its next call: each matrix is converted at once.
      auto read = [&](const std::string& name, const Shape& shape) {
        const TensorView t = source->get(name, shape);
        return to_bf16(t.data(), t.dtype(), static_cast<size_t>(t.numel()));
      };
      g = read(names.gate, {inter_, hidden});
      u = read(names.up, {inter_, hidden});
      d = read(names.down, {hidden, inter_});
    }
    place(e, g.data(), u.data(), d.data(), inter_);
  }
  if (shared_ > 0) {
    // The shared MLP of shared x inter splits into `shared` experts of inter (its intermediate
    // rows, and down's columns, in runs of inter): their sum is the MLP.
    const std::vector<uint16_t> g = to_bf16(host.shared.w_gate), u = to_bf16(host.shared.w_up),
                                d = to_bf16(host.shared.w_down);
    for (int j = 0; j < shared_; ++j) {
      place(E + j, g.data() + j * inter_ * h, u.data() + j * inter_ * h, d.data() + j * inter_, shared_ * inter_);
    }
  }
}

int64_t CudaMoe::gate_row(int64_t r) { return (r / kInterleave) * 2 * kInterleave + r % kInterleave; }

void CudaMoe::upload_fp8(const Fp8BlockWeights& source, const std::string& prefix, Device device) {
  const int E = config_.n_routed_experts, bo = source.block_out(), bi = source.block_in();
  const int64_t h = hidden_, Ip = inter_padded_, I = inter_;
  const ExpertNames first = expert_names(prefix, config_, 0);
  Fp8BlockWeights::Fp8Matrix probe;
  if (!source.fp8_matrix(first.gate, {I, h}, probe)) return;  // experts stored otherwise: bf16
  // The kernel applies one scale per 16-value step of k: blocks must be whole steps, and the
  // shared experts' split must fall on block edges.
  SPECULA_CHECK(bi % 16 == 0 && h % 16 == 0 && (shared_ <= 1 || I % bi == 0),
                "--fp8-expert-weights fp8 needs weight_block_size columns ({}) and hidden_size ({}) in multiples of 16 "
                "and, with {} shared experts, moe_intermediate_size ({}) a multiple of the block; use bf16",
                bi, h, shared_, I);
  fp8_ = true;
  scale_k_ = bi;
  const int64_t stacked = E + shared_, kb_gate = (h + bi - 1) / bi, kb_down = (Ip + bi - 1) / bi;
  w_gate_up_ = Buffer(DType::u8, {stacked, 2 * Ip, h}, device);
  w_down_ = Buffer(DType::u8, {stacked, h, Ip}, device);
  scale_gate_up_ = Buffer(DType::f32, {stacked, 2 * Ip, kb_gate}, device);
  scale_down_ = Buffer(DType::f32, {stacked, h, kb_down}, device);
  std::vector<uint8_t> gate_up(static_cast<size_t>(2 * Ip * h)), down(static_cast<size_t>(h * Ip));
  std::vector<float> gate_up_scale(static_cast<size_t>(2 * Ip * kb_gate)), down_scale(static_cast<size_t>(h * kb_down));
  // Expert e: intermediate rows [row0, row0 + inter) of gate / up and the same columns of down
  // (whose rows are d_cols wide), codes and per-row scales into slot e.
  auto place = [&](int64_t e, const Fp8BlockWeights::Fp8Matrix& g, const Fp8BlockWeights::Fp8Matrix& u,
                   const Fp8BlockWeights::Fp8Matrix& d, int64_t row0, int64_t d_cols) {
    std::fill(gate_up.begin(), gate_up.end(), uint8_t{0});
    std::fill(gate_up_scale.begin(), gate_up_scale.end(), 1.0f);
    for (int64_t r = 0; r < I; ++r) {
      for (const auto& [m, dst] : {std::pair{&g, gate_row(r)}, std::pair{&u, gate_row(r) + kInterleave}}) {
        std::copy_n(m->codes.data() + (row0 + r) * h, h, gate_up.data() + dst * h);
        std::copy_n(m->scales.data() + ((row0 + r) / bo) * m->block_cols, kb_gate, gate_up_scale.data() + dst * kb_gate);
      }
    }
    std::fill(down.begin(), down.end(), uint8_t{0});
    std::fill(down_scale.begin(), down_scale.end(), 1.0f);
    for (int64_t r = 0; r < h; ++r) {
      std::copy_n(d.codes.data() + r * d_cols + row0, I, down.data() + r * Ip);
      for (int64_t kb = 0; kb < (I + bi - 1) / bi; ++kb) {
        down_scale[static_cast<size_t>(r * kb_down + kb)] = d.scales[static_cast<size_t>((r / bo) * d.block_cols + row0 / bi + kb)];
      }
    }
    auto copy_to = [](Buffer& b, int64_t offset, const void* src, size_t bytes) {
      CUDA_CHECK(cudaMemcpy(static_cast<uint8_t*>(b.data()) + offset, src, bytes, cudaMemcpyHostToDevice));
    };
    copy_to(w_gate_up_, e * 2 * Ip * h, gate_up.data(), gate_up.size());
    copy_to(w_down_, e * h * Ip, down.data(), down.size());
    copy_to(scale_gate_up_, e * 2 * Ip * kb_gate * 4, gate_up_scale.data(), gate_up_scale.size() * 4);
    copy_to(scale_down_, e * h * kb_down * 4, down_scale.data(), down_scale.size() * 4);
  };
  auto read = [&](const std::string& name, const Shape& shape) {
    Fp8BlockWeights::Fp8Matrix m;
    SPECULA_CHECK(source.fp8_matrix(name, shape, m), "'{}' is not fp8 while the layer's other experts are", name);
    return m;
  };
  for (int e = 0; e < E; ++e) {
    const ExpertNames n = expert_names(prefix, config_, e);
    place(e, read(n.gate, {I, h}), read(n.up, {I, h}), read(n.down, {h, I}), 0, I);
  }
  if (shared_ > 0) {
    const std::string sp = prefix + "mlp.shared_experts.";
    const int64_t S = shared_;
    const auto g = read(sp + "gate_proj.weight", {S * I, h}), u = read(sp + "up_proj.weight", {S * I, h});
    const auto d = read(sp + "down_proj.weight", {h, S * I});
    for (int64_t j = 0; j < S; ++j) place(E + j, g, u, d, j * I, S * I);
  }
}

size_t CudaMoe::bytes() const {
  size_t bytes = 0;
  for (const Buffer* b : {&router_, &bias_, &w_gate_up_, &w_down_, &scale_gate_up_, &scale_down_}) {
    if (b->data() != nullptr) bytes += b->nbytes();
  }
  return bytes;
}

size_t CudaMoe::unread_bytes() const {
  const size_t stacked = static_cast<size_t>(config_.n_routed_experts + shared_);
  size_t expert_bytes = 0;
  for (const Buffer* b : {&w_gate_up_, &w_down_, &scale_gate_up_, &scale_down_}) {
    if (b->data() != nullptr) expert_bytes += b->nbytes() / stacked;
  }
  return static_cast<size_t>(config_.n_routed_experts - config_.num_experts_per_tok) * expert_bytes;
}

bool CudaMoe::in_block_order(const StepShape& sh) const { return sh.tile == ck::MoeTile::kLarge; }

CudaMoe::StepShape CudaMoe::step_shape(int64_t n) const {
  StepShape sh;
  // Each token's rows: its top k and the shared experts (experts E .. E + shared - 1).
  sh.per_token = config_.num_experts_per_tok + shared_;
  sh.stacked = config_.n_routed_experts + shared_;
  sh.pairs = n * sh.per_token;
  sh.rows = max_rows(sh.pairs, sh.stacked);
  sh.tile = ck::moe_pick_tile(sh.pairs, sh.stacked);
  sh.blocks = ck::moe_max_blocks(sh.pairs, sh.stacked, ck::moe_tile_rows(sh.tile));
  return sh;
}

void CudaMoe::forward(const float* xn, float* out, int64_t n, const CudaStepLinear& linear, cudaStream_t s) const {
  const MoeConfig& m = config_;
  const int E = m.n_routed_experts, k = m.num_experts_per_tok, h = hidden_;
  const StepShape sh = step_shape(n);
  CudaLayerScratch& ws = linear.scratch;
  const Device dev = linear.device;
  float* logits = ws.get(kMoeLogits, DType::f32, n * E, dev).data_as<float>();
  auto* ids = ws.get(kMoeIds, DType::i32, sh.pairs, dev).data_as<int32_t>();
  auto* weights = ws.get(kMoeWeights, DType::f32, sh.pairs, dev).data_as<float>();
  auto* sorted = ws.get(kMoeSorted, DType::i32, sh.rows, dev).data_as<int32_t>();
  auto* block_expert = ws.get(kMoeBlockExpert, DType::i32, sh.rows, dev).data_as<int32_t>();
  auto* slot = ws.get(kMoeSlot, DType::i32, sh.pairs, dev).data_as<int32_t>();
  auto* num_blocks = ws.get(kMoeBlocks, DType::i32, 1, dev).data_as<int32_t>();
  // Rows in block-list order for warpgroup MMA (moe_gather_split), else the tokens' rows. The
  // block-list layout holds a row per (token, expert) pair and the blocks' padding: as large as
  // y's rows (in bf16 hi + lo, the same bytes as y's f32), where the tokens' rows are top_k +
  // shared times fewer (DeepSeek-V2-Lite at 4096 tokens: 302 MB against 34 MB).
  const bool rows_in_blocks = in_block_order(sh);
  const int64_t x_rows = rows_in_blocks ? sh.rows : n;
  auto* x_hi = static_cast<uint16_t*>(ws.get(kMoeX, DType::bf16, 2 * x_rows * h, dev).data());
  ws.get(kMoeAct, DType::bf16, 2 * sh.rows * inter_padded_, dev);
  float* y = ws.get(kMoeY, DType::f32, sh.rows * h, dev).data_as<float>();
  if (n == 0) return;

  linear(xn, router_, Buffer{}, logits, n, h, E);
  ck::MoeRouteParams r;
  r.logits = logits;
  r.bias = bias_.data() != nullptr ? bias_.data_as<const float>() : nullptr;
  r.n = n;
  r.experts = E;
  r.top_k = k;
  r.groups = m.n_group;
  r.top_groups = m.topk_group;
  r.method = static_cast<int>(m.topk_method);
  r.sigmoid = m.sigmoid;
  r.normalise = m.norm_topk_prob && (k > 1 || m.norm_single);
  r.scale = m.scale_always;
  r.scaling_factor = m.routed_scaling_factor;
  r.shared = shared_;
  r.ids = ids;
  r.weights = weights;
  ck::moe_route(r, s);

  ck::MoeAlignParams a;
  a.ids = ids;
  a.pairs = sh.pairs;
  a.experts = sh.stacked;
  a.block_m = ck::moe_tile_rows(sh.tile);
  a.sorted = sorted;
  a.block_expert = block_expert;
  a.slot = slot;
  a.num_blocks = num_blocks;
  ck::moe_align(a, s);

  if (rows_in_blocks) {
    ck::MoeGatherParams gp;
    gp.x = xn;
    gp.sorted = sorted;
    gp.num_blocks = num_blocks;
    gp.block_m = a.block_m;
    gp.top_k = sh.per_token;
    gp.h = h;
    gp.max_rows = sh.blocks * a.block_m;
    gp.hi = x_hi;
    gp.lo = x_hi + x_rows * h;
    ck::moe_gather_split(gp, s);
  } else {
    ck::split_bf16(xn, x_hi, x_hi + n * h, n * h, s);
  }
  grouped_gemms(n, ws, s);

  ck::MoeCombineParams c;
  c.y = y;
  c.slot = slot;
  c.ids = ids;
  c.weights = weights;
  c.out = out;
  c.n = n;
  c.hidden = h;
  c.top_k = sh.per_token;
  ck::moe_combine(c, s);
}

void CudaMoe::grouped_gemms(int64_t n, const CudaLayerScratch& ws, cudaStream_t s, GemmVariant variant) const {
  const StepShape sh = step_shape(n);
  const int h = hidden_;
  auto slot = [&](CudaLayerSlot i) { return ws.ws.slots[i].data(); };
  auto* x_hi = static_cast<const uint16_t*>(slot(kMoeX));
  auto* act_hi = static_cast<uint16_t*>(slot(kMoeAct));
  const bool rows_in_blocks = in_block_order(sh);
  const int64_t x_rows = rows_in_blocks ? sh.rows : n;
  ck::MoeGemmParams g;
  g.a_hi = x_hi;
  g.a_lo = x_hi + x_rows * h;
  g.gather = !rows_in_blocks;
  g.a_rows = x_rows;
  g.cluster = variant != GemmVariant::unpaired;
  g.decode_stages = variant == GemmVariant::decode_shallow ? 3 : variant == GemmVariant::decode_deep ? 5 : 0;
  g.top_k = sh.per_token;
  g.sorted = static_cast<const int32_t*>(slot(kMoeSorted));
  g.block_expert = static_cast<const int32_t*>(slot(kMoeBlockExpert));
  g.num_blocks = static_cast<const int32_t*>(slot(kMoeBlocks));
  g.max_blocks = sh.blocks;
  g.w = w_gate_up_.data();
  g.n = 2 * inter_padded_;
  g.k = h;
  g.experts = sh.stacked;
  g.mma_sync = variant == GemmVariant::mma_sync;
  if (variant == GemmVariant::bf16_activations) g.a_lo = nullptr;
  g.gate_up = true;
  if (fp8_) {
    g.w_scale = scale_gate_up_.data_as<const float>();
    g.scale_k = scale_k_;
  }
  g.act_hi = act_hi;
  g.act_lo = act_hi + sh.rows * inter_padded_;
  ck::moe_gemm(g, sh.tile, s);

  ck::MoeGemmParams d = g;
  d.a_hi = act_hi;
  d.a_lo = variant == GemmVariant::bf16_activations ? nullptr : act_hi + sh.rows * inter_padded_;
  d.gather = false;
  d.a_rows = sh.rows;
  d.w = w_down_.data();
  d.n = h;
  d.k = inter_padded_;
  d.gate_up = false;
  if (fp8_) d.w_scale = scale_down_.data_as<const float>();
  d.act_hi = d.act_lo = nullptr;
  d.out = static_cast<float*>(slot(kMoeY));
  ck::moe_gemm(d, sh.tile, s);
}

}  // namespace specula
