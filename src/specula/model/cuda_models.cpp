// LlamaCuda and DeepseekCuda: Model over LlamaCudaModel / DeepseekCudaModel. A step replays a
// captured graph when one holds it (decode graphs; verify graphs for Llama-family targets),
// otherwise initialises the backend's metadata and runs eagerly.
#include "specula/model/cuda_models.h"

#include <algorithm>

#include "specula/core/error.h"
#include "specula/model/deepseek_cuda.h"
#include "specula/model/llama_cuda.h"

namespace specula {

namespace {

class LlamaCuda final : public Model {
 public:
  LlamaCuda(const ModelConfig& config, const WeightSource& weights, const ModelOptions& o)
      : host_(config, weights),
        exec_(host_, o.device, o.deterministic),
        backend_(make_llama_backend(host_, o, exec_.stream())) {}
  const ModelConfig& config() const override { return host_.config(); }
  size_t weight_bytes() const override { return exec_.weight_bytes(); }
  void* cuda_stream() const override { return exec_.stream(); }
  AttentionBackend* attention_backend() override { return backend_.get(); }
  const LlamaModel* llama() const override { return &host_; }
  bool on_gpu() const override { return true; }

  void forward(ForwardBatch& batch, std::vector<float>& logits, const ForwardRequest& r) override {
    if (r.use_cuda_graph && !r.all_tokens && r.capture == nullptr &&
        exec_.forward_decode_graph(batch, *backend_, logits, r.greedy_ids)) {
      return;
    }
    if (r.use_cuda_graph && r.all_tokens &&
        exec_.forward_verify_graph(batch, *backend_, logits, r.capture, r.greedy_ids)) {
      return;
    }
    backend_->init_forward_metadata(batch);
    exec_.forward(batch, *backend_, logits, r.all_tokens, r.capture, r.greedy_ids);
  }

  void capture_decode_graphs(const GraphSetup& g, int max_tokens) override {
    backend_->init_cuda_graph_state(max_batch(g), max_tokens);
    exec_.capture_decode_graphs(*backend_, g.batch_sizes, g.padding_req_row, g.padding_slot, g.req_pool, g.kv_pool);
  }
  void capture_verify_graphs(const GraphSetup& g, int num_draft_tokens, const std::vector<int>& layers) override {
    exec_.capture_verify_graphs(*backend_, g.batch_sizes, num_draft_tokens, layers, g.padding_req_row, g.req_pool,
                                g.kv_pool);
  }
  std::vector<int> graph_batch_sizes() const override { return exec_.graph_batch_sizes(); }

  static int max_batch(const GraphSetup& g) {
    int m = 0;
    for (int bs : g.batch_sizes) m = std::max(m, bs);
    return m;
  }

 private:
  LlamaModel host_;
  LlamaCudaModel exec_;
  // Declared after the executor, so it goes first: it runs on the executor's stream.
  std::unique_ptr<AttentionBackend> backend_;
};

class DeepseekCuda final : public Model {
 public:
  DeepseekCuda(const ModelConfig& config, const WeightSource& weights, const ModelOptions& o)
      : host_(config, weights), exec_(host_, o.device), backend_(make_deepseek_backend(host_, o, exec_.stream())) {}
  const ModelConfig& config() const override { return host_.config(); }
  size_t weight_bytes() const override { return exec_.weight_bytes(); }
  void* cuda_stream() const override { return exec_.stream(); }
  MlaAttentionBackend* mla_backend() override { return backend_.get(); }
  bool on_gpu() const override { return true; }

  void forward(ForwardBatch& batch, std::vector<float>& logits, const ForwardRequest& r) override {
    SPECULA_CHECK(r.capture == nullptr, "{}: capturing hidden states for a draft head is not supported",
                  host_.config().architecture);
    if (r.use_cuda_graph && !r.all_tokens && exec_.forward_decode_graph(batch, *backend_, logits, r.greedy_ids)) return;
    backend_->init_forward_metadata(batch);
    exec_.forward(batch, *backend_, logits, r.all_tokens, r.greedy_ids);
  }

  void capture_decode_graphs(const GraphSetup& g, int max_tokens) override {
    backend_->init_cuda_graph_state(LlamaCuda::max_batch(g), max_tokens);
    exec_.capture_decode_graphs(*backend_, g.batch_sizes, g.padding_req_row, g.padding_slot, g.req_pool,
                                g.mla_kv_pool);
  }
  std::vector<int> graph_batch_sizes() const override { return exec_.graph_batch_sizes(); }

 private:
  DeepseekModel host_;
  DeepseekCudaModel exec_;
  std::unique_ptr<MlaAttentionBackend> backend_;
};

}  // namespace

std::unique_ptr<Model> make_cuda_model(const ModelConfig& config, const WeightSource& weights,
                                       const ModelOptions& options) {
  if (config.is_mla()) return std::make_unique<DeepseekCuda>(config, weights, options);
  return std::make_unique<LlamaCuda>(config, weights, options);
}

}  // namespace specula
