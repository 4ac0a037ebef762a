// `specula bench allreduce`.
#include "specula/cli/bench_allreduce.h"

#include <fmt/format.h>

#include <algorithm>
#include <barrier>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "specula/core/error.h"

#ifdef SPECULA_HAS_CUDA
#include <cuda_runtime_api.h>

#include "specula/core/cuda_check.h"
#include "specula/core/cuda_graph.h"
#include "specula/parallel/tp_comm.h"
#endif

namespace specula {

namespace {

struct Options {
  int tp_size = 2;
  int calls = 200;
};

#ifdef SPECULA_HAS_CUDA

// GPU 0 -> GPU 1 copy rate (cudaMemcpyPeerAsync of 256 MiB), GB/s.
double peer_copy_gbps() {
  const size_t bytes = size_t{256} << 20;
  void *a = nullptr, *b = nullptr;
  CUDA_CHECK(cudaSetDevice(1));
  CUDA_CHECK(cudaMalloc(&b, bytes));
  CUDA_CHECK(cudaSetDevice(0));
  CUDA_CHECK(cudaMalloc(&a, bytes));
  cudaEvent_t start = nullptr, stop = nullptr;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  CUDA_CHECK(cudaMemcpyPeer(b, 1, a, 0, bytes));
  CUDA_CHECK(cudaEventRecord(start));
  for (int i = 0; i < 5; ++i) CUDA_CHECK(cudaMemcpyPeerAsync(b, 1, a, 0, bytes));
  CUDA_CHECK(cudaEventRecord(stop));
  CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  cudaFree(a);
  CUDA_CHECK(cudaSetDevice(1));
  cudaFree(b);
  CUDA_CHECK(cudaSetDevice(0));
  return 5.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
}

// Microseconds per call on rank 0 of `calls` all-reduces of `count` floats, every rank on its own
// thread and stream; as CUDA graphs of 20 calls replayed, or launched one by one.
double time_all_reduce(TpGroup& group, int64_t count, AllReducePath path, bool graph, int calls) {
  const int n = group.size();
  std::vector<double> us(static_cast<size_t>(n), 0);
  std::barrier sync(n);
  std::vector<std::thread> threads;
  std::vector<std::string> errors(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        CUDA_CHECK(cudaSetDevice(r));
        float* data = nullptr;
        CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&data), static_cast<size_t>(count) * sizeof(float)));
        CUDA_CHECK(cudaMemset(data, 0, static_cast<size_t>(count) * sizeof(float)));
        cudaStream_t s = nullptr;
        CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        constexpr int kPerGraph = 20;
        std::unique_ptr<CudaGraph> g;
        auto some = [&](int k) {
          for (int i = 0; i < k; ++i) group.rank(r).all_reduce(data, count, s, path);
        };
        some(5);
        if (graph) g = std::make_unique<CudaGraph>(s, [&] { some(kPerGraph); });
        CUDA_CHECK(cudaStreamSynchronize(s));
        cudaEvent_t start = nullptr, stop = nullptr;
        CUDA_CHECK(cudaEventCreate(&start));
        CUDA_CHECK(cudaEventCreate(&stop));
        const int rounds = graph ? std::max(1, calls / kPerGraph) : calls;
        sync.arrive_and_wait();
        CUDA_CHECK(cudaEventRecord(start, s));
        for (int i = 0; i < rounds; ++i) {
          if (graph) {
            g->launch(s);
          } else {
            some(1);
          }
        }
        CUDA_CHECK(cudaEventRecord(stop, s));
        CUDA_CHECK(cudaEventSynchronize(stop));
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
        us[static_cast<size_t>(r)] = ms * 1e3 / (rounds * (graph ? kPerGraph : 1));
        g.reset();
        cudaEventDestroy(start);
        cudaEventDestroy(stop);
        cudaStreamDestroy(s);
        cudaFree(data);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < n; ++r) SPECULA_CHECK(errors[static_cast<size_t>(r)].empty(), "rank {}: {}", r, errors[static_cast<size_t>(r)]);
  return *std::max_element(us.begin(), us.end());
}

void run(const Options& o) {
  TpGroup group(o.tp_size);
  fmt::print("specula bench allreduce  {}\n", group.describe());
  const double copy = o.tp_size >= 2 ? peer_copy_gbps() : 0;
  fmt::print("GPU 0 -> GPU 1 copy measured now: {:.0f} GB/s\n\n", copy);
  fmt::print("{:>10} {:>12} {:>12} {:>12} {:>12} {:>14} {:>14}\n", "bytes", "peer us", "peer graph", "nccl us",
             "nccl graph", "peer busbw GB/s", "nccl busbw GB/s");
  const double factor = 2.0 * (o.tp_size - 1) / o.tp_size;
  for (int64_t bytes = 4096; bytes <= (int64_t{256} << 20); bytes *= 2) {
    const int64_t count = bytes / 4;
    const bool peer = group.rank(0).peer_serves(count);
    const int calls = bytes >= (int64_t{16} << 20) ? 40 : o.calls;
    const double pe = peer ? time_all_reduce(group, count, AllReducePath::peer, false, calls) : 0;
    const double pg = peer ? time_all_reduce(group, count, AllReducePath::peer, true, calls) : 0;
    const double ne = time_all_reduce(group, count, AllReducePath::nccl, false, calls);
    const double ng = time_all_reduce(group, count, AllReducePath::nccl, true, calls);
    auto busbw = [&](double us) { return us > 0 ? factor * static_cast<double>(bytes) / (us * 1e-6) / 1e9 : 0.0; };
    auto cell = [&](double us) { return us > 0 ? fmt::format("{:.2f}", us) : std::string("-"); };
    fmt::print("{:>10} {:>12} {:>12} {:>12.2f} {:>12.2f} {:>14.1f} {:>14.1f}\n", bytes, cell(pe), cell(pg), ne, ng,
               busbw(std::min(pe > 0 ? pe : 1e30, pg > 0 ? pg : 1e30)), busbw(std::min(ne, ng)));
  }
}

#else

void run(const Options&) { SPECULA_CHECK(false, "bench allreduce needs a CUDA build"); }

#endif

}  // namespace

void add_bench_allreduce_command(CLI::App& bench) {
  auto o = std::make_shared<Options>();
  CLI::App* cmd = bench.add_subcommand("allreduce", "Tensor parallelism's all-reduce: peer path against NCCL");
  cmd->add_option("--tp-size", o->tp_size, "GPUs (cuda:0 .. cuda:N-1)")->capture_default_str();
  cmd->add_option("--calls", o->calls, "Calls timed per message size")->capture_default_str();
  cmd->callback([o] { run(*o); });
}

}  // namespace specula
