// CudaGraph: the kernels a function launches on a stream, recorded once (stream capture) and
// replayed with one launch. The model's decode and verify graphs and the draft head's graphs use
// it; whatever the launches read must sit in buffers that outlive the graph and never move.
#pragma once

#include <functional>

namespace specula {

class CudaGraph {
 public:
  // Runs `launches` under capture on stream (a cudaStream_t) and instantiates the result.
  CudaGraph(void* stream, const std::function<void()>& launches);
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  // Replays the graph on stream, without a sync.
  void launch(void* stream) const;

 private:
  void* exec_ = nullptr;  // cudaGraphExec_t
};

}  // namespace specula
