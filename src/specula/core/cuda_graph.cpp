// CudaGraph: cudaStreamBeginCapture / EndCapture / GraphInstantiate.
#include "specula/core/cuda_graph.h"

#include <cuda_runtime_api.h>

#include "specula/core/cuda_check.h"

namespace specula {

CudaGraph::CudaGraph(void* stream, const std::function<void()>& launches) {
  const auto s = static_cast<cudaStream_t>(stream);
  cudaGraph_t graph = nullptr;
  CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  launches();
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

}  // namespace specula
