// EagleCudaModel: upload and the head's forward.
#include "specula/model/eagle_cuda.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "specula/core/cuda_check.h"
#include "specula/core/error.h"
#include "specula/model/cuda/cuda_linear.h"
#include "specula/model/cuda/eagle_input.h"
#include "specula/model/cuda/model_ops.h"

namespace specula {

namespace ck = cuda_kernels;

namespace {
// dst[r, offset : offset + width] = src[r, :] for rows of dst_width values.
void copy_columns(float* dst, int dst_width, int offset, const float* src, int width, int64_t rows, cudaStream_t s) {
  CUDA_CHECK(cudaMemcpy2DAsync(dst + offset, dst_width * sizeof(float), src, width * sizeof(float), width * sizeof(float),
                               static_cast<size_t>(rows), cudaMemcpyDeviceToDevice, s));
}
}  // namespace

EagleCudaModel::EagleCudaModel(const EagleHead& head, Device device, void* stream)
    : head_(head), device_(device), stream_(stream) {
  const ModelConfig& c = head.config();
  SPECULA_CHECK(c.hidden_size % 8 == 0 && c.intermediate_size % 8 == 0 && head.feature_size() % 8 == 0,
                "the GPU draft head needs widths that are multiples of 8 (hidden {}, intermediate {}, features {})",
                c.hidden_size, c.intermediate_size, head.feature_size());
  linear_ = std::make_unique<CudaLinear>(device, stream, false);
  const EagleWeights& w = head.weights();
  embed_ = upload_weight(w.embed.empty() ? head.target().embedding() : w.embed, device);
  fc_ = upload_weight(w.fc, device);
  fc_bias_ = upload_f32(w.fc_bias, device);
  input_norm_ = upload_f32(w.input_norm, device);
  hidden_norm_ = upload_f32(w.hidden_norm, device);
  final_norm_ = upload_f32(w.final_norm, device);
  const DecoderLayerDims dims{c.hidden_size, head.kind() == EagleKind::EAGLE3 ? 2 * c.hidden_size : c.hidden_size,
                             c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.intermediate_size,
                             static_cast<float>(c.rms_norm_eps), false};
  layer_ = std::make_unique<CudaDecoderLayer>(w.layer, dims, device);
  lm_head_ = upload_weight(head.kind() == EagleKind::EAGLE ? head.target().lm_head() : w.lm_head, device);
  inv_freq_ = upload_f32(head.inv_freq(), device);
  if (head.kind() == EagleKind::EAGLE3) {
    d2t_ = Buffer(DType::i64, {static_cast<int64_t>(w.d2t.size())}, device);
    copy(d2t_, TensorView(const_cast<int64_t*>(w.d2t.data()), DType::i64, {static_cast<int64_t>(w.d2t.size())}));
  }
}

EagleCudaModel::~EagleCudaModel() = default;

void EagleCudaModel::forward(Workspace& ws, int64_t n, const int32_t* ids, const int32_t* positions, const float* hidden_in,
                             bool from_target, const CudaAttend& attend, const int32_t* row_ids, int64_t rows,
                             const CudaKvWrite& kv) {
  const ModelConfig& c = head_.config();
  const auto s = static_cast<cudaStream_t>(stream_);
  const int h = c.hidden_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const bool eagle3 = head_.kind() == EagleKind::EAGLE3;
  const CudaStepLinear linear{*linear_, ws.layer, device_};
  float* x = scratch(ws, kX, DType::f32, n * h).data_as<float>();
  float* a = scratch(ws, kA, DType::f32, n * 2 * h).data_as<float>();
  float* xn = scratch(ws, kXn, DType::f32, n * h).data_as<float>();
  float* selected = scratch(ws, kSelected, DType::f32, std::max<int64_t>(rows, 1) * h).data_as<float>();
  float* logits = scratch(ws, kLogits, DType::f32, std::max<int64_t>(rows, 1) * head_.draft_vocab_size()).data_as<float>();

  const float* attn_input = nullptr;
  if (eagle3) {
    // x: the residual stream (fc over the target's fused layers, or the fed-back hidden state);
    // the attention reads [input_layernorm(embedding) ; hidden_norm(x)].
    if (from_target) linear(hidden_in, fc_, Buffer{}, x, n, head_.feature_size(), h);
    ck::eagle3_attention_input(embed_.data(), embed_.dtype() == DType::bf16, ids, from_target ? x : hidden_in,
                               input_norm_.data_as<const float>(), hidden_norm_.data_as<const float>(), a,
                               from_target ? nullptr : x, n, h, eps, s);
    attn_input = a;
  } else {
    // x = fc([embedding ; feature]); the layer has no input norm.
    float* emb = scratch(ws, kEmb, DType::f32, n * h).data_as<float>();
    if (embed_.dtype() == DType::bf16) {
      ck::embed_rows_bf16(embed_.data(), ids, emb, n, h, 1.0f, s);
    } else {
      ck::embed_rows(embed_.data_as<const float>(), ids, emb, n, h, 1.0f, s);
    }
    copy_columns(a, 2 * h, 0, emb, h, n, s);
    copy_columns(a, 2 * h, h, hidden_in, h, n, s);
    linear(a, fc_, fc_bias_, x, n, 2 * h, h);
    attn_input = x;
  }
  CudaLayerStep st;
  st.n = n;
  st.attn_input = attn_input;
  st.x = x;
  st.xn = xn;
  st.positions = positions;
  st.inv_freq = inv_freq_.data_as<const float>();
  st.rope_factor = head_.rope_attention_factor();
  st.kv = kv;
  if (eagle3 && row_ids == nullptr && rows == n) {
    // Every row's logits (a draft step): the residual add and the final norm in one launch.
    st.end_norm = final_norm_.data_as<const float>();
    st.end_out = selected;
    layer_->forward(st, attend, linear, s);
    linear(selected, lm_head_, Buffer{}, logits, rows, h, head_.draft_vocab_size());
    return;
  }
  layer_->forward(st, attend, linear, s);

  if (rows == 0) return;
  const float* src = x;
  if (row_ids != nullptr) {
    ck::gather_rows(x, row_ids, selected, rows, h, s);
    src = selected;
  }
  if (eagle3) {
    ck::rms_norm_rows(src, final_norm_.data_as<const float>(), selected, rows, h, eps, s);
    src = selected;
  }
  // EAGLE: the target's lm_head over the unnormed output; EAGLE-3: its own, after its norm.
  linear(src, lm_head_, Buffer{}, logits, rows, h, head_.draft_vocab_size());
}

}  // namespace specula
