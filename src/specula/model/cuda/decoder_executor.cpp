// CudaDecoderExecutor: the shared step of the GPU decoders.
#include "specula/model/cuda/decoder_executor.h"

#include <algorithm>

#include "specula/core/cuda_check.h"
#include "specula/core/error.h"
#include "specula/model/cuda/cuda_linear.h"
#include "specula/model/cuda/step_io.h"
#include "specula/parallel/tp_greedy.h"

namespace specula {

CudaDecoderExecutor::CudaDecoderExecutor(std::unique_ptr<const CpuDecoder> host, Device device, bool deterministic,
                                         int64_t vocab_begin, int64_t vocab_end, TpComm* tp_comm,
                                         bool nonblocking_stream)
    : host_owned_(std::move(host)), host_(*host_owned_), device_(device), deterministic_(deterministic),
      tp_comm_(tp_comm), vocab_begin_(vocab_begin) {
  SPECULA_CHECK(device.is_cuda(), "a GPU decoder needs a CUDA device, not {}", device.str());
  stream_ = create_model_stream(device, nonblocking_stream);
  cudaEvent_t results = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&results, cudaEventDisableTiming));
  results_event_ = results;
  linear_ = std::make_unique<CudaLinear>(device, stream_, deterministic);
  ends_ = std::make_unique<CudaDecoderEnds>(host_, device, vocab_begin, vocab_end);
}

CudaDecoderExecutor::~CudaDecoderExecutor() {
  graphs_.clear();
  linear_.reset();
  if (results_event_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(results_event_));
  if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

Buffer& CudaDecoderExecutor::scratch(Workspace& ws, size_t slot, DType dtype, int64_t elements) {
  return ws.get(slot, dtype, elements, device_);
}

CudaStepLinear CudaDecoderExecutor::step_linear(Workspace& ws) const { return {*linear_, ws.layer, device_}; }

void CudaDecoderExecutor::check_ids(const ForwardBatch& batch) const {
  const int vocab = host_.config().vocab_size;
  for (int32_t id : batch.input_ids) SPECULA_CHECK(id >= 0 && id < vocab, "token id {} is out of range [0, {})", id, vocab);
}

void CudaDecoderExecutor::upload_step(Workspace& ws, const ForwardBatch& batch, int requests) {
  const auto s = static_cast<cudaStream_t>(stream_);
  const int64_t n = batch.num_tokens();
  upload_ids_async(scratch(ws, kIds, DType::i32, n), batch, requests, s);
  upload_i32_async(scratch(ws, kPositions, DType::i32, n), batch.positions, s);
  upload_i32_async(scratch(ws, kCacheLoc, DType::i32, n), batch.out_cache_loc, s);
  upload_model_step(ws, batch);
}

float* CudaDecoderExecutor::run_head(Workspace& ws, const int32_t* row_ids, int64_t count) {
  const ModelConfig& c = host_.config();
  float* selected = scratch(ws, kSelected, DType::f32, count * c.hidden_size).data_as<float>();
  float* out = scratch(ws, kLogits, DType::f32, count * head_vocab()).data_as<float>();
  const CudaStepLinear linear = step_linear(ws);
  ends_->logits(ws[kX].data_as<const float>(), row_ids, count, selected, out,
                [&](const float* x, const Buffer& w, float* y, int64_t n, int in, int o) { linear(x, w, Buffer{}, y, n, in, o); },
                static_cast<cudaStream_t>(stream_));
  return out;
}

void CudaDecoderExecutor::eager_forward(const ForwardBatch& batch, std::vector<float>& logits,
                                        const ForwardRequest& request, const std::function<void()>& results_hook) {
  const auto s = static_cast<cudaStream_t>(stream_);
  const int64_t n = batch.num_tokens();
  SPECULA_CHECK(static_cast<int64_t>(batch.input_ids.size()) == n && static_cast<int64_t>(batch.positions.size()) == n,
                "batch has {} tokens but {} input_ids and {} positions", n, batch.input_ids.size(), batch.positions.size());
  check_ids(batch);
  init_metadata(batch);
  upload_step(eager_, batch, batch.batch_size);
  run_layers(batch, eager_, n, request.capture);
  const std::vector<int32_t> rows = logit_rows(batch, request.all_tokens);
  const int64_t count = rows.empty() ? n : static_cast<int64_t>(rows.size());
  const int32_t* row_ids = nullptr;
  if (!rows.empty()) {
    Buffer& b = scratch(eager_, kRowIds, DType::i32, count);
    upload_i32_async(b, rows, s);
    row_ids = b.data_as<const int32_t>();
  }
  run_head(eager_, row_ids, count);
  download(eager_, count, logits, request, results_hook);
}

void CudaDecoderExecutor::download(const Workspace& ws, int64_t rows, std::vector<float>& logits,
                                   const ForwardRequest& request, const std::function<void()>& results_hook) {
  download_step(pinned_, ws[kLogits].data_as<const float>(), rows, head_vocab(), logits,
                request.greedy_ids, request.token_bitmask, request.host_work, greedy_, request.capture, ws[kCaptured].data_as<const float>(), device_,
                static_cast<cudaStream_t>(stream_), results_hook, static_cast<cudaEvent_t>(results_event_),
                tp_greedy_combine());
}

void CudaDecoderExecutor::capture_decode_graphs(const GraphSetup& g, int max_tokens) {
  init_graph_state(*std::max_element(g.batch_sizes.begin(), g.batch_sizes.end()), max_tokens);
  graphs_.capture(
      g.batch_sizes, g.padding_req_row, g.padding_slot, stream_,
      [&](ForwardBatch& b) {
        b.req_to_token_pool = g.req_pool;
        b.token_to_kv_pool = g.kv_pool;
        b.mla_kv_pool = g.mla_kv_pool;
        init_capture_metadata(b);
        upload_step(graph_ws_, b, 0);
      },
      [&](const ForwardBatch& b) {
        run_layers(b, graph_ws_, b.batch_size, nullptr);
        run_head(graph_ws_, nullptr, b.batch_size);
      },
      [&] { graph_ws_.freeze(); });
}

int CudaDecoderExecutor::head_vocab() const { return ends_->vocab_size(); }

GreedyCombine CudaDecoderExecutor::tp_greedy_combine() {
  if (tp_comm_ == nullptr) return {};
  return [this](int32_t* ids, float* values, int64_t rows) {
    specula::tp_greedy_combine(*tp_comm_, ids, values, rows, vocab_begin_, tp_greedy_scratch_, device_,
                               static_cast<cudaStream_t>(stream_));
  };
}

bool CudaDecoderExecutor::replay_decode(const ForwardBatch& batch, std::vector<float>& logits, const ForwardRequest& r) {
  ForwardBatch padded;
  const CudaGraph* graph = graphs_.find(batch, &padded);
  if (graph == nullptr) return false;
  check_ids(batch);
  init_replay_metadata(padded);
  upload_step(graph_ws_, padded, 0);
  graph->launch(stream_);
  download_step(pinned_, graph_ws_[kLogits].data_as<const float>(), batch.batch_size, head_vocab(), logits,
                r.greedy_ids, r.token_bitmask, r.host_work, greedy_, nullptr, nullptr, device_,
                static_cast<cudaStream_t>(stream_), {}, static_cast<cudaEvent_t>(results_event_), tp_greedy_combine());
  return true;
}

}  // namespace specula
