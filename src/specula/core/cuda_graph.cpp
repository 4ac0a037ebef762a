// CudaGraph: cudaStreamBeginCapture / EndCapture / GraphInstantiate.
#include "specula/core/cuda_graph.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "specula/core/cuda_check.h"
#include "specula/core/error.h"

namespace specula {

CudaGraph::CudaGraph(void* stream, const std::function<void()>& launches) {
  const auto s = static_cast<cudaStream_t>(stream);
  cudaGraph_t graph = nullptr;
  CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  try {
    launches();
  } catch (...) {
    // A capture left open poisons the device: every later synchronising call, on any stream,
    // fails with "operation not permitted when stream is capturing". End it before rethrowing.
    if (cudaStreamEndCapture(s, &graph) == cudaSuccess && graph != nullptr) cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    throw;
  }
  CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  CUDA_CHECK(err);
  exec_ = exec;
}

CudaGraph::~CudaGraph() {
  if (exec_ != nullptr) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
}

void CudaGraph::launch(void* stream) const {
  CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), static_cast<cudaStream_t>(stream)));
}

void CudaGraphSet::capture(void* stream, std::vector<int> batch_sizes, const std::function<void(int)>& prepare,
                           const std::function<void(int)>& launches, const std::function<void()>& freeze) {
  std::sort(batch_sizes.begin(), batch_sizes.end(), std::greater<>());
  for (int bs : batch_sizes) {
    SPECULA_CHECK(bs >= 1, "CUDA-graph batch size {} is not valid; it must be >= 1", bs);
    prepare(bs);
    launches(bs);
    CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
    freeze();
    graphs_[bs] = std::make_unique<CudaGraph>(stream, [&] { launches(bs); });
  }
}

std::pair<int, const CudaGraph*> CudaGraphSet::find(int batch) const {
  const auto it = graphs_.lower_bound(batch);
  if (it == graphs_.end()) return {0, nullptr};
  return {it->first, it->second.get()};
}

std::vector<int> CudaGraphSet::batch_sizes() const {
  std::vector<int> sizes;
  for (const auto& [bs, graph] : graphs_) sizes.push_back(bs);
  return sizes;
}

}  // namespace specula
