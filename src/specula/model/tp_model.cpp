// TensorParallelModel: the rank threads, the shards, and the combination of the ranks' logits.
#include "specula/model/tp_model.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <optional>
#include <cstring>
#include <exception>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "specula/core/cuda_check.h"
#include "specula/core/device_memory.h"
#include "specula/core/error.h"
#include "specula/kv/mha_kv_pool.h"
#include "specula/kv/mla_kv_pool.h"
#include "specula/model/cuda_models.h"
#include "specula/model/tp_shard.h"
#include "specula/parallel/tp_comm.h"

namespace specula {

namespace {

// One thread per GPU (its current device set once): run(fn) calls fn(rank) on every thread at
// once and returns when all are done, rethrowing the lowest rank's error as "rank r: ...".
class RankWorkers {
 public:
  // devices[r]: rank r's GPU.
  explicit RankWorkers(const std::vector<int>& devices) : errors_(devices.size()) {
    for (size_t r = 0; r < devices.size(); ++r) {
      threads_.emplace_back([this, r, d = devices[r]] { loop(static_cast<int>(r), d); });
    }
  }
  ~RankWorkers() {
    {
      std::lock_guard<std::mutex> hold(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  int size() const { return static_cast<int>(threads_.size()); }

  void start(std::function<void(int)> fn) {
    std::lock_guard<std::mutex> hold(mutex_);
    task_ = std::move(fn);
    pending_ = size();
    first_error_.reset();
    for (std::string& e : errors_) e.clear();
    ++generation_;
    wake_.notify_all();
  }
  // Returns when every rank is done. When a rank failed and another is still running
  // kStuckSeconds later (waiting in a collective for the failed one), on_stuck runs once, to
  // abort the communicators and let it return. Throws the lowest rank's error; `disagreed` tells
  // whether some ranks failed and others did not (the ranks may then be out of step).
  void wait(const std::function<void()>& on_stuck = {}, bool* disagreed = nullptr) {
    constexpr auto kStuck = std::chrono::seconds(30);
    std::unique_lock<std::mutex> hold(mutex_);
    bool aborted = false;
    while (pending_ > 0) {
      done_.wait_for(hold, std::chrono::seconds(1));
      if (!aborted && on_stuck && first_error_ && std::chrono::steady_clock::now() - *first_error_ > kStuck) {
        aborted = true;
        hold.unlock();
        on_stuck();
        hold.lock();
      }
    }
    size_t failed = 0;
    for (const std::string& e : errors_) failed += e.empty() ? 0 : 1;
    if (disagreed != nullptr) *disagreed = failed > 0 && failed < errors_.size();
    for (size_t r = 0; r < errors_.size(); ++r) {
      SPECULA_CHECK(errors_[r].empty(), "tensor-parallel rank {}: {}", r, errors_[r]);
    }
  }
  void run(std::function<void(int)> fn) {
    start(std::move(fn));
    wait();
  }

 private:
  void loop(int rank, int device) {
    uint64_t seen = 0;
    const bool device_ok = cudaSetDevice(device) == cudaSuccess;
    for (;;) {
      std::function<void(int)> task;
      {
        std::unique_lock<std::mutex> hold(mutex_);
        wake_.wait(hold, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        task = task_;
      }
      std::string error;
      try {
        SPECULA_CHECK(device_ok, "cannot use GPU {}", device);
        task(rank);
      } catch (const std::exception& e) {
        error = e.what();
      }
      std::lock_guard<std::mutex> hold(mutex_);
      if (!error.empty() && !first_error_) first_error_ = std::chrono::steady_clock::now();
      errors_[static_cast<size_t>(rank)] = std::move(error);
      if (--pending_ == 0) done_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::function<void(int)> task_;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::vector<std::string> errors_;
  std::optional<std::chrono::steady_clock::time_point> first_error_;
  std::vector<std::thread> threads_;
};

class TensorParallelModel final : public Model {
 public:
  TensorParallelModel(const ModelConfig& config, const WeightSource& weights, const ModelOptions& options)
      : config_(config), size_(options.tp_size), group_(make_group(options.tp_size)), workers_(devices(*group_)) {
    SPECULA_CHECK(options.double_sparsity == nullptr, "--tp-size {} cannot be combined with --enable-double-sparsity",
                  size_);
    // Two ranks add their halves the same way whatever the order; more ranks summed by NCCL in an
    // order that may depend on the message size would make results depend on the batch.
    SPECULA_CHECK(!options.fp8_experts, "--tp-size {} keeps experts in bf16; --fp8-expert-weights fp8 runs on one GPU "
                  "only in this build", size_);
    SPECULA_CHECK(!options.deterministic || size_ <= 2,
                  "--enable-deterministic-inference is available up to --tp-size 2 in this build, not {}", size_);
    for (int r = 0; r < size_; ++r) layouts_.push_back(tp_layout(config, {r, size_}));
    ranks_.resize(static_cast<size_t>(size_));
    kv_.resize(static_cast<size_t>(size_));
    mla_kv_.resize(static_cast<size_t>(size_));
    // Every rank reads the source under one lock (a synthetic source's views are shared scratch);
    // each converts and uploads its own slices in parallel.
    auto lock = std::make_shared<std::mutex>();
    try {
      workers_.run([&](int r) {
        const TpShard shard{r, size_};
        const TpShardWeights shard_weights(weights, config, shard, lock);
        ModelOptions o = options;
        o.device = Device::cuda(group_->device(r));
        o.tp_size = 1;
        o.tp_comm = &group_->rank(r);
        o.nonblocking_stream = group_->device(0) == group_->device(size_ - 1);
        o.vocab_begin = layouts_[static_cast<size_t>(r)].vocab.begin;
        o.vocab_end = layouts_[static_cast<size_t>(r)].vocab.end;
        ranks_[static_cast<size_t>(r)] = make_cuda_model(tp_shard_config(config, shard), shard_weights, o);
      });
    } catch (...) {
      release();
      throw;
    }
  }
  ~TensorParallelModel() override {
    release();
    if (rank0_event_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(rank0_event_));
  }

  const ModelConfig& config() const override { return config_; }
  size_t weight_bytes() const override {
    size_t bytes = 0;
    for (const auto& m : ranks_) bytes += m->weight_bytes();
    return bytes;
  }
  size_t decode_weight_bytes_per_gpu() const override {
    size_t most = 0;
    for (const auto& m : ranks_) most = std::max(most, m->decode_weight_bytes());
    return most;
  }
  void* cuda_stream() const override { return ranks_[0]->cuda_stream(); }
  // Rank 0's host model: its embedding and lm_head are whole (what a draft head shares).
  const LlamaModel* llama() const override { return ranks_[0]->llama(); }
  bool on_gpu() const override { return true; }
  std::vector<int> graph_batch_sizes() const override { return ranks_[0]->graph_batch_sizes(); }
  bool owns_kv_cache() const override { return true; }

  void create_kv_cache(const KVPoolConfig& full) override {
    run([&](int r) {
      KVPoolConfig c = full;
      c.num_kv_heads = static_cast<int>(layouts_[static_cast<size_t>(r)].kv_heads.size());
      c.device = Device::cuda(group_->device(r));
      kv_[static_cast<size_t>(r)] = std::make_unique<MHAKVPool>(c);
    });
  }
  void create_mla_kv_cache(const MLAKVPoolConfig& full) override {
    run([&](int r) {
      MLAKVPoolConfig c = full;
      c.device = Device::cuda(group_->device(r));
      mla_kv_[static_cast<size_t>(r)] = std::make_unique<MLAKVPool>(c);
    });
  }

  void capture_decode_graphs(const GraphSetup& setup, int max_tokens) override {
    run([&](int r) {
      GraphSetup g = setup;
      g.kv_pool = kv_[static_cast<size_t>(r)].get();
      g.mla_kv_pool = mla_kv_[static_cast<size_t>(r)].get();
      ranks_[static_cast<size_t>(r)]->capture_decode_graphs(g, max_tokens);
    });
  }

  // A draft head runs on rank 0's GPU and reads the hidden states rank 0 captures (the residual
  // stream is whole on every rank after its all-reduce); the other ranks capture nothing.
  void capture_verify_graphs(const GraphSetup& setup, const std::vector<int>& num_draft_tokens,
                             const std::vector<int>& capture_layers) override {
    run([&](int r) {
      GraphSetup g = setup;
      g.kv_pool = kv_[static_cast<size_t>(r)].get();
      g.mla_kv_pool = mla_kv_[static_cast<size_t>(r)].get();
      ranks_[static_cast<size_t>(r)]->capture_verify_graphs(g, num_draft_tokens, r == 0 ? capture_layers : std::vector<int>{});
    });
  }

  void copy_kv_slots(std::span<const int32_t> src, std::span<const int32_t> dst) override {
    if (src.empty()) return;
    run([&](int r) {
      const auto k = static_cast<size_t>(r);
      if (kv_[k] != nullptr) kv_[k]->copy_slots(src, dst, ranks_[k]->cuda_stream());
      if (mla_kv_[k] != nullptr) mla_kv_[k]->copy_slots(src, dst, ranks_[k]->cuda_stream());
    });
  }

  void forward(ForwardBatch& batch, std::vector<float>& logits, const ForwardRequest& request) override;

 private:
  // SPECULA_TP_ONE_DEVICE=1: every rank on GPU 0 (tests of the tensor-parallel model on a machine
  // with one GPU): peer all-reduce only, and non-blocking model streams, so that no legacy-stream
  // copy of one rank waits behind another rank's spinning all-reduce.
  // Ranks sharing a GPU also need every kernel loaded up front: a rank's first launch of a
  // kernel under lazy loading may wait for the GPU's running kernels, among them the other rank's
  // all-reduce that spins for this rank (two GPUs do not share a context, so they need not).
  static bool one_device() {
    const char* v = std::getenv("SPECULA_TP_ONE_DEVICE");
    if (v == nullptr || std::string(v) != "1") return false;
    const char* loading = std::getenv("CUDA_MODULE_LOADING");
    SPECULA_CHECK(loading != nullptr && std::string(loading) == "EAGER",
                  "SPECULA_TP_ONE_DEVICE=1 needs CUDA_MODULE_LOADING=EAGER, set before the process starts");
    return true;
  }
  static std::unique_ptr<TpGroup> make_group(int size) {
    return std::make_unique<TpGroup>(size, int64_t{1} << 20, one_device());
  }

  // An event on rank 0's stream after the work queued there so far (from the calling thread).
  void record_rank0_event() {
    int current = 0;
    CUDA_CHECK(cudaGetDevice(&current));
    CUDA_CHECK(cudaSetDevice(group_->device(0)));
    if (rank0_event_ == nullptr) {
      cudaEvent_t e = nullptr;
      CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      rank0_event_ = e;
    }
    CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(rank0_event_), static_cast<cudaStream_t>(ranks_[0]->cuda_stream())));
    CUDA_CHECK(cudaSetDevice(current));
  }
  static std::vector<int> devices(const TpGroup& g) {
    std::vector<int> d;
    for (int r = 0; r < g.size(); ++r) d.push_back(g.device(r));
    return d;
  }

  // Waits for the ranks' current task (a step, or graph capture), then frees what the ranks
  // released meanwhile (frees wait for peer GPUs; device_memory.h). Any rank's failure makes the
  // model unusable: a rank may have queued collectives its peers never match (and a trapped peer
  // all-reduce leaves a GPU in error), so later steps are refused instead of hanging or mixing
  // two steps' messages. Ranks still waiting 30 s after one failed get the communicators aborted.
  void finish() {
    try {
      workers_.wait([this] {
        broken_ = true;
        group_->abort();
      });
    } catch (...) {
      broken_ = true;
      end_deferred_frees();
      throw;
    }
    end_deferred_frees();
  }
  void check_usable() const {
    SPECULA_CHECK(!broken_, "a tensor-parallel rank failed in an earlier step and the ranks are out of step; restart "
                  "the engine");
  }
  void run(std::function<void(int)> fn) {
    check_usable();
    begin_deferred_frees();
    workers_.start(std::move(fn));
    finish();
  }

  // Models and pools go on their own threads (their streams and buffers belong to those GPUs)
  // before the communicators.
  void release() {
    workers_.run([&](int r) {
      ranks_[static_cast<size_t>(r)].reset();
      kv_[static_cast<size_t>(r)].reset();
      mla_kv_[static_cast<size_t>(r)].reset();
    });
  }

  ModelConfig config_;
  int size_;
  std::unique_ptr<TpGroup> group_;
  std::vector<TpLayout> layouts_;
  std::vector<std::unique_ptr<Model>> ranks_;
  std::vector<std::unique_ptr<MHAKVPool>> kv_;
  std::vector<std::unique_ptr<MLAKVPool>> mla_kv_;
  std::atomic<bool> broken_{false};
  void* rank0_event_ = nullptr;  // cudaEvent_t on rank 0's GPU
  RankWorkers workers_;
};

void TensorParallelModel::forward(ForwardBatch& batch, std::vector<float>& logits, const ForwardRequest& r) {
  SPECULA_CHECK(kv_[0] != nullptr || mla_kv_[0] != nullptr,
                "the tensor-parallel model's KV cache was not created (create_kv_cache)");
  check_usable();
  const auto n = static_cast<size_t>(size_);
  std::vector<std::vector<float>> part_logits(n);
  std::vector<std::vector<int32_t>> part_ids(n);
  const bool greedy = r.greedy_ids != nullptr;
  // Structured output's masks: filled once, on this thread, while the ranks run; each rank's
  // argmax takes the words of its vocabulary part (whose bounds are multiples of 32).
  std::promise<void> mask_ready;
  std::shared_future<void> mask_done = mask_ready.get_future().share();
  std::vector<uint32_t> mask;
  const size_t words = (static_cast<size_t>(config_.vocab_size) + 31) / 32;
  // A verify whose tree tokens the draft head wrote on rank 0's GPU: the other ranks copy them
  // from there (peer memory) once rank 0's stream has written them.
  const bool tree_on_device = batch.spec_info != nullptr && batch.spec_info->device_tree_tokens != nullptr;
  if (tree_on_device) record_rank0_event();
  begin_deferred_frees();  // ended by finish()
  workers_.start([&](int rank) {
    const auto k = static_cast<size_t>(rank);
    ForwardBatch b = batch;
    b.token_to_kv_pool = kv_[k].get();
    b.mla_kv_pool = mla_kv_[k].get();
    ForwardRequest rr = r;
    rr.host_work = nullptr;  // run once, on this thread, below
    if (rank != 0) {
      // Hidden states and the verify's device hook are rank 0's alone (the draft head's GPU).
      rr.capture = nullptr;
      if (b.spec_info != nullptr && b.spec_info->on_device_results) {
        auto info = std::make_shared<SpecInfo>(*b.spec_info);
        info->on_device_results = nullptr;
        b.spec_info = info;
      }
      if (tree_on_device) {
        CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(ranks_[k]->cuda_stream()),
                                       static_cast<cudaEvent_t>(rank0_event_), 0));
      }
    }
    // Every rank's greedy tokens are already the whole vocabulary's (combined on the devices).
    if (greedy) rr.greedy_ids = &part_ids[k];
    if (r.token_bitmask) {
      const TpRange v = layouts_[k].vocab;
      rr.token_bitmask = [&, v](std::span<uint32_t> out) {
        mask_done.wait();
        const size_t local = (static_cast<size_t>(v.size()) + 31) / 32;
        const size_t rows = out.size() / local;
        const size_t first = static_cast<size_t>(v.begin) / 32;
        for (size_t row = 0; row < rows; ++row) {
          std::memcpy(out.data() + row * local, mask.data() + row * words + first, local * sizeof(uint32_t));
        }
      };
    }
    ranks_[k]->forward(b, part_logits[k], rr);
  });
  if (r.token_bitmask) {
    try {
      const size_t rows = r.all_tokens ? static_cast<size_t>(batch.num_tokens()) : static_cast<size_t>(batch.batch_size);
      mask.assign(rows * words, 0);
      r.token_bitmask(mask);
    } catch (...) {
      mask_ready.set_value();
      finish();
      throw;
    }
    mask_ready.set_value();
  }
  if (r.host_work) {
    try {
      r.host_work();
    } catch (...) {
      finish();
      throw;
    }
  }
  finish();
  if (greedy) {
    *r.greedy_ids = std::move(part_ids[0]);
    return;
  }
  const auto V = static_cast<size_t>(config_.vocab_size);
  const size_t rows = part_logits[0].size() / static_cast<size_t>(layouts_[0].vocab.size());
  logits.resize(rows * V);
  for (size_t k = 0; k < n; ++k) {
    const auto width = static_cast<size_t>(layouts_[k].vocab.size());
    const auto begin = static_cast<size_t>(layouts_[k].vocab.begin);
    for (size_t row = 0; row < rows; ++row) {
      std::copy_n(part_logits[k].data() + row * width, width, logits.data() + row * V + begin);
    }
  }
}

}  // namespace

std::unique_ptr<Model> make_tensor_parallel_model(const ModelConfig& config, const WeightSource& weights,
                                                  const ModelOptions& options) {
  check_tensor_parallel(config, options.tp_size);
  SPECULA_CHECK(options.device.is_cuda() && options.device.index == 0,
                "--tp-size {} runs on GPUs cuda:0 .. cuda:{}; give --device cuda, not {}", options.tp_size,
                options.tp_size - 1, options.device.str());
  return std::make_unique<TensorParallelModel>(config, weights, options);
}

}  // namespace specula
