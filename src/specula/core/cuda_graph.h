// CudaGraph: the kernels a function launches on a stream, recorded once (stream capture) and
// replayed with one launch. The model's decode and verify graphs and the draft head's graphs use
// it; whatever the launches read must sit in buffers that outlive the graph and never move.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <vector>

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

// One graph per batch size, each recorded the same way: for each size, largest first,
// prepare(bs) readies the inputs (and the backend's capture metadata), launches(bs) runs once
// eagerly (one-time set-ups of cuBLAS and the backends happen outside capture, and the largest
// size sizes the workspaces), the stream is synchronised, freeze() fixes the workspaces, and
// launches(bs) is recorded. Every capture site (the decoders' decode and verify graphs, the
// draft head's loop and extend graphs) uses it.
class CudaGraphSet {
 public:
  void capture(void* stream, std::vector<int> batch_sizes, const std::function<void(int)>& prepare,
               const std::function<void(int)>& launches, const std::function<void()>& freeze);
  // The smallest graph that holds `batch` requests and its size; {0, nullptr} when none does.
  std::pair<int, const CudaGraph*> find(int batch) const;
  std::vector<int> batch_sizes() const;
  bool empty() const { return graphs_.empty(); }
  void clear() { graphs_.clear(); }

 private:
  std::map<int, std::unique_ptr<CudaGraph>> graphs_;
};

}  // namespace specula
