// A one-shot all-reduce over peer memory for decode-sized f32 messages (the small-message path
// SGLang, vLLM and TensorRT-LLM add beside NCCL): each rank copies its values into its own staging
// buffer, raises a flag in every peer's memory, waits for every peer's flag, then reads every
// rank's staging buffer over NVLink and sums them in rank order (so every rank gets the same bits).
// One launch, no host sync, graph-capturable: flags carry a per-block epoch kept in device memory
// (every call runs every block, so the epochs move together), and the staging buffer alternates
// halves by epoch: a rank writes a half again only after its peers' whole previous call, whose
// handshake needed this rank's flags from the call that read that half. A rank that waits longer than kPeerWaitSeconds for a peer traps (a CUDA
// error on the host) instead of hanging.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace specula::cuda_kernels {

inline constexpr int kPeerMaxRanks = 8;
inline constexpr int kPeerMaxBlocks = 36;
inline constexpr double kPeerWaitSeconds = 20.0;

struct PeerAllReduceArgs {
  float* staging[kPeerMaxRanks] = {};  // each rank's, 2 * capacity floats, readable from every rank
  uint32_t* flags[kPeerMaxRanks] = {};  // each rank's [kPeerMaxRanks][kPeerMaxBlocks], zeroed at start
  uint32_t* counters = nullptr;        // this rank's [kPeerMaxBlocks], zeroed at start
  int rank = 0;
  int size = 1;
  int64_t capacity = 0;  // floats per staging half: the largest message
};

// data [count] f32 on this rank's device (16-byte aligned, count a multiple of 4 and at most
// capacity) becomes the sum over ranks; every rank calls it with the same count, in the same order.
void peer_all_reduce(const PeerAllReduceArgs& args, float* data, int64_t count, cudaStream_t s);

// Loads the peer kernels on the current device now. Under CUDA's lazy module loading (the
// default), a kernel's first launch loads it, which may wait for the GPU's running kernels; a
// rank whose first launch of a kernel waits behind the other rank's copy of it, spinning for this
// one, would never return (both ranks on one GPU hung so in a test). CUDA's documented remedy is
// to load such kernels before any of them runs.
void preload_peer_kernels();

// The same, fused with the residual add and RMSNorm that follow a row-parallel product (SGLang's
// and TensorRT-LLM's fused all-reduce): o [rows, width] is each rank's partial sum; then
// x += sum over ranks of o, y = w * (x / rms(x)) (rms over the row, eps inside the root), and
// copy (optional) gets the new x at rows copy_stride apart. One launch instead of two; o is left
// as it was. width a multiple of 4, rows x width at most capacity.
struct PeerAddNorm {
  float* x = nullptr;
  const float* w = nullptr;
  float* y = nullptr;
  float eps = 1e-6f;
  float* copy = nullptr;
  int64_t copy_stride = 0;
};
void peer_all_reduce_add_rms_norm(const PeerAllReduceArgs& args, const float* o, int64_t rows, int width,
                                  const PeerAddNorm& norm, cudaStream_t s);

}  // namespace specula::cuda_kernels
