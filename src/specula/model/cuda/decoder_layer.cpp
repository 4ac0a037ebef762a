// CudaDecoderLayer: upload (q|k|v and gate|up stacked: one product and one pass over x instead of
// three and two) and the layer's launches.
#include "specula/model/cuda/decoder_layer.h"

#include "specula/model/cuda/cuda_linear.h"
#include "specula/model/cuda/cuda_moe.h"
#include "specula/model/cuda/fused_ops.h"
#include "specula/model/cuda/model_ops.h"
#include "specula/parallel/tp_comm.h"

namespace specula {

namespace ck = cuda_kernels;

CudaStepLinear::Split CudaStepLinear::split(const Buffer& w, int64_t n, int in, int out) const {
  if (!linear.needs_split(w, n, in)) return {};
  // hi and lo as one [2n, in] block, so that one GEMM may take both.
  auto* hi = static_cast<uint16_t*>(scratch.get(kLayerSplit, DType::bf16, 2 * n * in, device).data());
  Split sp{hi, hi + n * in, nullptr};
  if (!CudaLinear::stacks(n, out)) return sp;
  // The output scratch at the cap at once: a CUDA graph's workspace is frozen after the warm-up
  // of its largest batch, whose products may stack less than a smaller batch's do. A frozen
  // workspace without it takes the two-GEMM form.
  constexpr int64_t kCap = CudaLinear::kMaxStackedBytes / static_cast<int64_t>(sizeof(float));
  const Buffer& held = scratch.ws.slots[kLayerHalves];
  if (scratch.ws.frozen && (held.data() == nullptr || held.dtype() != DType::f32 || held.numel() < 2 * n * out)) return sp;
  sp.halves = scratch.get(kLayerHalves, DType::f32, kCap, device).data_as<float>();
  return sp;
}

void CudaStepLinear::operator()(const float* x, const Buffer& w, const Buffer& bias, float* y, int64_t n, int in,
                                int out) const {
  const Split sp = split(w, n, in, out);
  linear(x, w, bias, y, n, in, out, sp.hi, sp.lo, sp.halves);
}

CudaDecoderLayer::CudaDecoderLayer(const DecoderLayerWeights& w, const DecoderLayerDims& dims, Device device,
                                   const WeightSource* experts, const std::string& prefix, bool fp8_experts)
    : dims_(dims) {
  input_norm_ = upload_f32(w.input_norm, device);
  post_norm_ = upload_f32(w.post_norm, device);
  post_attn_norm_ = upload_f32(w.post_attn_norm, device);
  post_ffn_norm_ = upload_f32(w.post_ffn_norm, device);
  // A host model without the matrices (LlamaModel's layer_matrices false): read from the checkpoint.
  const bool from_source = w.wq.empty() && experts != nullptr;
  const int64_t q_out = static_cast<int64_t>(dims.num_q_heads) * dims.head_dim;
  const int64_t kv_out = static_cast<int64_t>(dims.num_kv_heads) * dims.head_dim;
  const int64_t h = dims.hidden, in = dims.attn_in, inter = dims.intermediate;
  if (from_source) {
    w_qkv_ = upload_weight_rows(*experts, {{prefix + "self_attn.q_proj.weight", {q_out, in}},
                                           {prefix + "self_attn.k_proj.weight", {kv_out, in}},
                                           {prefix + "self_attn.v_proj.weight", {kv_out, in}}}, device);
    wo_ = upload_weight_rows(*experts, {{prefix + "self_attn.o_proj.weight", {h, q_out}}}, device);
  } else {
    w_qkv_ = upload_weight(stack_rows({&w.wq, &w.wk, &w.wv}), device);
    wo_ = upload_weight(w.wo, device);
  }
  b_qkv_ = upload_f32(stack_rows({&w.bq, &w.bk, &w.bv}), device);
  bo_ = upload_f32(w.bo, device);
  if (from_source && !w.moe.layer) {
    w_gate_up_ = upload_weight_rows(*experts, {{prefix + "mlp.gate_proj.weight", {inter, h}},
                                               {prefix + "mlp.up_proj.weight", {inter, h}}}, device);
    w_down_ = upload_weight_rows(*experts, {{prefix + "mlp.down_proj.weight", {h, inter}}}, device);
  } else {
    w_gate_up_ = upload_weight(stack_rows({&w.w_gate, &w.w_up}), device);
    w_down_ = upload_weight(w.w_down, device);
  }
  b_gate_up_ = upload_f32(stack_rows({&w.b_gate, &w.b_up}), device);
  b_down_ = upload_f32(w.b_down, device);
  q_norm_ = upload_f32(w.q_norm, device);
  k_norm_ = upload_f32(w.k_norm, device);
  if (w.moe.layer) {
    SPECULA_CHECK(dims.moe != nullptr, "a mixture-of-experts layer needs its routing (DecoderLayerDims::moe)");
    moe_ = std::make_unique<CudaMoe>(*dims.moe, w.moe, experts, prefix, dims.hidden, device, fp8_experts);
  }
}

CudaDecoderLayer::~CudaDecoderLayer() = default;
CudaDecoderLayer::CudaDecoderLayer(CudaDecoderLayer&&) noexcept = default;

size_t CudaDecoderLayer::bytes() const {
  size_t bytes = 0;
  for (const Buffer* b : {&input_norm_, &post_norm_, &post_attn_norm_, &post_ffn_norm_, &w_qkv_, &b_qkv_, &wo_, &bo_,
                          &w_gate_up_, &b_gate_up_, &w_down_, &b_down_, &q_norm_, &k_norm_}) {
    if (b->data() != nullptr) bytes += b->nbytes();
  }
  return bytes + (moe_ != nullptr ? moe_->bytes() : 0);
}

size_t CudaDecoderLayer::moe_unread_bytes() const { return moe_ != nullptr ? moe_->unread_bytes() : 0; }

namespace {
const float* optional(const Buffer& b) { return b.data() != nullptr ? b.data_as<const float>() : nullptr; }
}  // namespace

void CudaDecoderLayer::forward(const CudaLayerStep& st, const CudaAttend& attend, const CudaStepLinear& linear,
                               cudaStream_t s) const {
  const DecoderLayerDims& d = dims_;
  const int64_t n = st.n;
  const int h = d.hidden, D = d.head_dim, Hq = d.num_q_heads, Hkv = d.num_kv_heads, inter = d.intermediate;
  const int qkv_width = (Hq + 2 * Hkv) * D;
  CudaLayerScratch& ws = linear.scratch;
  const Device dev = linear.device;
  float* qkv = ws.get(kLayerQkv, DType::f32, n * qkv_width, dev).data_as<float>();
  const int V = st.q_variants;
  Buffer& qb = ws.get(kLayerQ, DType::bf16, n * Hq * V * D, dev);
  Buffer& kb = ws.get(kLayerK, DType::bf16, n * Hkv * D, dev);
  Buffer& vb = ws.get(kLayerV, DType::bf16, n * Hkv * D, dev);
  Buffer& ab = ws.get(kLayerAttnBf16, DType::bf16, n * Hq * D, dev);
  float* attn = ws.get(kLayerAttnF32, DType::f32, n * Hq * D, dev).data_as<float>();
  float* o = ws.get(kLayerO, DType::f32, n * h, dev).data_as<float>();

  linear(st.attn_input, w_qkv_, b_qkv_, qkv, n, d.attn_in, qkv_width);
  ck::QkvEpilogueParams e{};
  e.qkv = qkv;
  e.positions = st.positions;
  e.inv_freq = st.inv_freq;
  e.rope_factor = st.rope_factor;
  e.q_norm = optional(q_norm_);
  e.k_norm = optional(k_norm_);
  e.eps = d.eps;
  e.q = qb.data();
  e.k = kb.data();
  e.v = vb.data();
  e.n = n;
  e.num_q_heads = Hq;
  e.num_kv_heads = Hkv;
  e.head_dim = D;
  e.dca_chunk_len = st.dca_chunk_len;
  e.dca_chunk_size = st.dca_chunk_size;
  e.q_variants = V;
  e.key_scale = st.key_scale;
  if (st.kv.cache_loc != nullptr) {
    e.k_cache = st.kv.k_cache;
    e.v_cache = st.kv.v_cache;
    e.cache_loc = st.kv.cache_loc;
    e.cache_dtype = st.kv.cache_dtype;
    e.k_scale = st.kv.k_scale;
    e.v_scale = st.kv.v_scale;
  }
  ck::qkv_epilogue(e, s);
  attend(TensorView(qb.data(), DType::bf16, {n, Hq, V * D}, dev), TensorView(kb.data(), DType::bf16, {n, Hkv, D}, dev),
         TensorView(vb.data(), DType::bf16, {n, Hkv, D}, dev), TensorView(ab.data(), DType::bf16, {n, Hq, D}, dev));
  linear.linear.product_bf16_x(ab.data(), wo_, bo_, o, n, Hq * D, h, attn);
  // Tensor parallelism: o holds this rank's partial sum. Without Gemma-2's output norm, the
  // all-reduce, the residual add and the next norm are one peer kernel where it serves.
  const bool fused = st.comm != nullptr && post_attn_norm_.data() == nullptr &&
                     st.comm->all_reduce_add_rms_norm(o, n, h, st.x, post_norm_.data_as<const float>(), st.xn, d.eps,
                                                      nullptr, 0, s);
  if (!fused) {
    if (st.comm != nullptr) st.comm->all_reduce(o, n * h, s);
    if (post_attn_norm_.data() != nullptr) ck::rms_norm_rows(o, post_attn_norm_.data_as<const float>(), o, n, h, d.eps, s);
    ck::add_rms_norm_rows(st.x, o, post_norm_.data_as<const float>(), st.xn, n, h, d.eps, s);
  }
  if (moe_ != nullptr) {
    moe_->forward(st.xn, o, n, linear, s);
  } else {
    float* gate_up = ws.get(kLayerGateUp, DType::f32, n * 2 * inter, dev).data_as<float>();
    float* act = ws.get(kLayerAct, DType::f32, n * inter, dev).data_as<float>();
    const CudaStepLinear::Split sp = linear.split(w_gate_up_, n, h, 2 * inter);
    linear.linear.gated(st.xn, w_gate_up_, b_gate_up_, act, n, h, inter, d.gelu, gate_up, sp.hi, sp.lo, sp.halves);
    linear(act, w_down_, b_down_, o, n, inter, h);
  }
  if (st.comm != nullptr && post_ffn_norm_.data() == nullptr && st.end_norm != nullptr &&
      st.comm->all_reduce_add_rms_norm(o, n, h, st.x, st.end_norm, st.end_out, d.eps, st.end_copy, st.end_copy_stride,
                                       s)) {
    return;
  }
  if (st.comm != nullptr) st.comm->all_reduce(o, n * h, s);
  if (post_ffn_norm_.data() != nullptr) ck::rms_norm_rows(o, post_ffn_norm_.data_as<const float>(), o, n, h, d.eps, s);
  if (st.end_norm != nullptr) {
    ck::add_rms_norm_rows(st.x, o, st.end_norm, st.end_out, n, h, d.eps, s, st.end_copy, st.end_copy_stride);
  } else {
    ck::add_inplace(st.x, o, n * h, s);
  }
}

}  // namespace specula
