// TpGroup: the communicators of tensor parallelism over the GPUs of one process (one worker thread
// per GPU, see model/tp_model.h): NCCL communicators made at once for every rank
// (ncclCommInitAll), peer access between every pair of GPUs, and the one-shot peer all-reduce's
// buffers. TpComm is one rank's handle: an in-place f32 sum over ranks on the rank's stream,
// through the peer all-reduce for messages up to peer_max_bytes when every pair of GPUs has peer
// access, else through NCCL (large messages, GPUs without peer access, or SPECULA_TP_ALLREDUCE=nccl).
// SPECULA_TP_ALLREDUCE=skip leaves every all-reduce out, for benchmarks only (the results are
// wrong): a decode step's time without communication, beside the real one.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace specula {

enum class AllReducePath { automatic, peer, nccl };

class TpComm {
 public:
  virtual ~TpComm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // data[count] (f32, on this rank's GPU) becomes the sum over ranks; every rank calls it with the
  // same count, in the same order, on its model's stream (a cudaStream_t). Capturable in a graph.
  virtual void all_reduce(float* data, int64_t count, void* stream, AllReducePath path = AllReducePath::automatic) = 0;
  // Whether the peer path serves a message of this many floats (the largest one it takes).
  virtual bool peer_serves(int64_t count) const = 0;
  // The all-reduce of a row-parallel product's partial sums o [rows, width] fused with the
  // residual add and RMSNorm after it: x += the sum, y = w * (x / rms(x)), copy (optional) gets
  // the new x at rows copy_stride apart. One peer kernel when the peer path serves the message
  // (and SPECULA_TP_FUSED is not 0); false otherwise, with nothing done: the caller all-reduces
  // and normalises apart. Decided from rows and width alone, so every rank decides the same.
  virtual bool all_reduce_add_rms_norm(const float* o, int64_t rows, int width, float* x, const float* w, float* y,
                                       float eps, float* copy, int64_t copy_stride, void* stream) = 0;
};

class TpGroup {
 public:
  // Ranks on CUDA devices 0..size-1. Throws specula::Error when fewer GPUs are present than
  // asked for, or when this build has no NCCL.
  // one_device (tests on a machine with one GPU): every rank on GPU 0, each with its own thread
  // and non-blocking stream (a blocking one would wait behind the other rank's spinning
  // all-reduce); no NCCL (it refuses two ranks on one GPU), every message through the peer path,
  // whose buffers then hold up to 64 MiB.
  explicit TpGroup(int size, int64_t peer_max_bytes = int64_t{1} << 20, bool one_device = false);
  ~TpGroup();
  TpGroup(const TpGroup&) = delete;
  TpGroup& operator=(const TpGroup&) = delete;

  int size() const { return static_cast<int>(ranks_.size()); }
  TpComm& rank(int r) { return *ranks_.at(static_cast<size_t>(r)); }
  bool peer_access() const { return peer_access_; }
  // The CUDA device of rank r.
  int device(int r) const { return one_device_ ? 0 : r; }
  // One line for logs: "tensor parallel 2: NCCL 2.28.3, peer all-reduce up to 1 MiB".
  std::string describe() const;
  // Aborts every NCCL communicator (ncclCommAbort; callable from any thread while ranks wait in
  // collectives), so that ranks stuck waiting for a failed one return with errors; the group
  // cannot be used afterwards. The peer path needs no abort: its waits time out by themselves.
  void abort();

 private:
  struct State;
  std::unique_ptr<State> state_;
  std::vector<std::unique_ptr<TpComm>> ranks_;
  bool peer_access_ = false;
  bool one_device_ = false;
};

}  // namespace specula
