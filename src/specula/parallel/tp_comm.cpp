// TpGroup: NCCL communicators, peer access and the peer all-reduce's buffers.
#include "specula/parallel/tp_comm.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "specula/core/error.h"

#if defined(SPECULA_HAS_CUDA) && defined(SPECULA_HAS_NCCL)
#include <cuda_runtime_api.h>

#include "specula/core/cuda_check.h"
#include "specula/parallel/nccl_api.h"
#include "specula/parallel/peer_all_reduce.h"
#endif

namespace specula {

#if defined(SPECULA_HAS_CUDA) && defined(SPECULA_HAS_NCCL)

#define NCCL_CHECK(call)                                                                                  \
  do {                                                                                                    \
    const ncclResult_t specula_nccl_status_ = (call);                                                     \
    SPECULA_CHECK(specula_nccl_status_ == ncclSuccess, "NCCL error '{}' from {}",                        \
                  nccl_api().error_string(specula_nccl_status_), #call);                                      \
  } while (0)

struct TpGroup::State {
  std::vector<ncclComm_t> comms;
  std::vector<void*> allocations;  // freed at the end, each on its device
  std::vector<int> allocation_devices;
  cuda_kernels::PeerAllReduceArgs peer;
  int64_t peer_max_floats = 0;
  std::atomic<bool> aborted{false};

  // Also when the constructor throws half-way.
  ~State() {
    for (ncclComm_t c : comms) {
      if (c != nullptr) nccl_api().comm_destroy(c);
    }
    for (size_t i = 0; i < allocations.size(); ++i) {
      cudaSetDevice(allocation_devices[i]);
      cudaFree(allocations[i]);
    }
  }
};

namespace {

class Rank final : public TpComm {
 public:
  Rank(int rank, int size, ncclComm_t comm, const cuda_kernels::PeerAllReduceArgs* peer, int64_t peer_max_floats,
       bool force_nccl, const std::atomic<bool>& aborted, bool skip)
      : rank_(rank), size_(size), comm_(comm), peer_max_floats_(peer != nullptr ? peer_max_floats : 0),
        force_nccl_(force_nccl), aborted_(aborted), skip_(skip) {
    if (peer != nullptr) {
      peer_ = *peer;
      peer_.rank = rank;
    }
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool peer_serves(int64_t count) const override {
    return !force_nccl_ && count <= peer_max_floats_ && count % 4 == 0;
  }
  void set_counters(uint32_t* counters) { peer_.counters = counters; }
  void set_fused(bool fused) { fused_ = fused; }

  bool all_reduce_add_rms_norm(const float* o, int64_t rows, int width, float* x, const float* w, float* y, float eps,
                               float* copy, int64_t copy_stride, void* stream) override {
    if (!fused_ || skip_ || width % 4 != 0 || !peer_serves(rows * width)) return false;
    SPECULA_CHECK(!aborted_, "the tensor-parallel communicators were aborted after a rank failed");
    cuda_kernels::peer_all_reduce_add_rms_norm(peer_, o, rows, width, {x, w, y, eps, copy, copy_stride},
                                               static_cast<cudaStream_t>(stream));
    return true;
  }

  void all_reduce(float* data, int64_t count, void* stream, AllReducePath path) override {
    const auto s = static_cast<cudaStream_t>(stream);
    SPECULA_CHECK(!aborted_, "the tensor-parallel communicators were aborted after a rank failed");
    if (skip_) return;
    // Decided from what every rank shares (the count), never from this rank's pointers: ranks
    // that chose differently would wait for each other forever.
    const bool peer = path == AllReducePath::peer || (path == AllReducePath::automatic && peer_serves(count));
    if (peer) {
      SPECULA_CHECK(peer_max_floats_ > 0, "the peer all-reduce is not available: the GPUs have no peer access");
      cuda_kernels::peer_all_reduce(peer_, data, count, s);
      return;
    }
    SPECULA_CHECK(comm_ != nullptr, "an all-reduce of {} floats: the ranks share one GPU and "
                  "have no NCCL; the peer path takes up to {}", count, peer_max_floats_);
    NCCL_CHECK(nccl_api().all_reduce(data, data, static_cast<size_t>(count), ncclFloat32, ncclSum, comm_, s));
  }

 private:
  int rank_, size_;
  ncclComm_t comm_;
  cuda_kernels::PeerAllReduceArgs peer_;
  int64_t peer_max_floats_;
  bool force_nccl_;
  const std::atomic<bool>& aborted_;
  bool skip_;  // SPECULA_TP_ALLREDUCE=skip: no communication (a benchmark's step without it)
  bool fused_ = true;  // SPECULA_TP_FUSED=0 turns the fused add + norm off (to measure it)
};

}  // namespace

TpGroup::TpGroup(int size, int64_t peer_max_bytes, bool one_device)
    : state_(std::make_unique<State>()), one_device_(one_device) {
  int caller_device = 0;
  cudaGetDevice(&caller_device);
  SPECULA_CHECK(size >= 1 && size <= cuda_kernels::kPeerMaxRanks, "--tp-size {} is not valid; it must be in [1, {}]",
                size, cuda_kernels::kPeerMaxRanks);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  SPECULA_CHECK(devices >= (one_device ? 1 : size), "--tp-size {} needs {} GPUs; this machine has {}", size, size,
                devices);
  // NVLink multicast (NVLS) stays off unless the user turned it on: on shared hosts it can take
  // the GPUs out of service, and a one-node all-reduce of two to eight GPUs does not need it.
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  // NCCL otherwise connects ranks at a communicator's first collective of each kind; when that
  // first collective is inside a CUDA-graph capture it fails ("internal error", seen on two H200s).
  setenv("NCCL_RUNTIME_CONNECT", "0", 0);
  State& st = *state_;
  st.comms.resize(static_cast<size_t>(size));
  std::vector<int> devs(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) devs[static_cast<size_t>(r)] = r;
  if (one_device) {
    st.comms.assign(static_cast<size_t>(size), nullptr);
    peer_max_bytes = std::max<int64_t>(peer_max_bytes, int64_t{64} << 20);
  } else {
    NCCL_CHECK(nccl_api().comm_init_all(st.comms.data(), size, devs.data()));
  }

  peer_access_ = size > 1;
  for (int i = 0; i < size && peer_access_ && !one_device; ++i) {
    for (int j = 0; j < size; ++j) {
      int ok = 0;
      if (i != j && (cudaDeviceCanAccessPeer(&ok, i, j) != cudaSuccess || ok == 0)) peer_access_ = false;
    }
  }
  const char* forced = std::getenv("SPECULA_TP_ALLREDUCE");
  const bool force_nccl = forced != nullptr && std::strcmp(forced, "nccl") == 0;
  const bool skip = forced != nullptr && std::strcmp(forced, "skip") == 0;
  SPECULA_CHECK(forced == nullptr || force_nccl || skip || std::strcmp(forced, "auto") == 0,
                "SPECULA_TP_ALLREDUCE={}: allowed auto, nccl, skip", forced);
  auto alloc = [&](int device, size_t bytes) {
    CUDA_CHECK(cudaSetDevice(device));
    void* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, bytes));
    CUDA_CHECK(cudaMemset(p, 0, bytes));
    st.allocations.push_back(p);
    st.allocation_devices.push_back(device);
    return p;
  };
  if (!one_device && size > 1) {
    // One small and one large all-reduce per rank, eagerly: whatever NCCL still sets up on first
    // use (protocol buffers, proxy state) then happens outside any later graph capture.
    const int64_t floats = int64_t{1} << 20;
    std::vector<float*> scratch(static_cast<size_t>(size), nullptr);
    for (int r = 0; r < size; ++r) scratch[static_cast<size_t>(r)] = static_cast<float*>(alloc(r, floats * sizeof(float)));
    for (int64_t count : {int64_t{1024}, floats}) {
      NCCL_CHECK(nccl_api().group_start());
      for (int r = 0; r < size; ++r) {
        CUDA_CHECK(cudaSetDevice(r));
        const auto k = static_cast<size_t>(r);
        NCCL_CHECK(nccl_api().all_reduce(scratch[k], scratch[k], static_cast<size_t>(count), ncclFloat32, ncclSum,
                                         st.comms[k], nullptr));
      }
      NCCL_CHECK(nccl_api().group_end());
    }
    for (int r = 0; r < size; ++r) {
      CUDA_CHECK(cudaSetDevice(r));
      CUDA_CHECK(cudaDeviceSynchronize());
    }
  }
  std::vector<uint32_t*> counters(static_cast<size_t>(size), nullptr);
  if (peer_access_) {
    for (int i = 0; i < size && !one_device; ++i) {
      CUDA_CHECK(cudaSetDevice(i));
      for (int j = 0; j < size; ++j) {
        if (i == j) continue;
        const cudaError_t e = cudaDeviceEnablePeerAccess(j, 0);
        if (e == cudaErrorPeerAccessAlreadyEnabled) {
          (void)cudaGetLastError();
        } else {
          CUDA_CHECK(e);
        }
      }
    }
    st.peer_max_floats = peer_max_bytes / static_cast<int64_t>(sizeof(float)) / 4 * 4;
    st.peer.size = size;
    st.peer.capacity = st.peer_max_floats;
    for (int r = 0; r < size; ++r) {
      const int d = device(r);
      CUDA_CHECK(cudaSetDevice(d));
      cuda_kernels::preload_peer_kernels();
      st.peer.staging[r] = static_cast<float*>(alloc(d, 2 * static_cast<size_t>(st.peer_max_floats) * sizeof(float)));
      st.peer.flags[r] = static_cast<uint32_t*>(
          alloc(d, sizeof(uint32_t) * cuda_kernels::kPeerMaxRanks * cuda_kernels::kPeerMaxBlocks));
      counters[static_cast<size_t>(r)] =
          static_cast<uint32_t*>(alloc(d, sizeof(uint32_t) * cuda_kernels::kPeerMaxBlocks));
    }
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  for (int r = 0; r < size; ++r) {
    auto rank = std::make_unique<Rank>(r, size, st.comms[static_cast<size_t>(r)], peer_access_ ? &st.peer : nullptr,
                                       st.peer_max_floats, force_nccl, st.aborted, skip);
    rank->set_counters(counters[static_cast<size_t>(r)]);
    const char* fused = std::getenv("SPECULA_TP_FUSED");
    rank->set_fused(fused == nullptr || std::strcmp(fused, "0") != 0);
    ranks_.push_back(std::move(rank));
  }
  CUDA_CHECK(cudaSetDevice(caller_device));
}

TpGroup::~TpGroup() { ranks_.clear(); }

void TpGroup::abort() {
  state_->aborted = true;
  for (ncclComm_t& c : state_->comms) {
    if (c != nullptr) nccl_api().comm_abort(c);
    c = nullptr;
  }
}

std::string TpGroup::describe() const {
  int version = 0;
  if (!one_device_) nccl_api().get_version(&version);
  const int major = version / 10000, minor = version / 100 % 100, patch = version % 100;
  if (one_device_) {
    return fmt::format("tensor parallel {}: every rank on GPU 0, peer all-reduce only", size());
  }
  return fmt::format("tensor parallel {}: NCCL {}.{}.{}, {}", size(), major, minor, patch,
                     peer_access_ ? fmt::format("peer all-reduce up to {} KiB", state_->peer_max_floats * 4 / 1024)
                                  : std::string("no peer access (NCCL only)"));
}

#else

struct TpGroup::State {};

TpGroup::TpGroup(int size, int64_t, bool) {
  SPECULA_CHECK(size == 1, "--tp-size {}: this build has no {}; tensor parallelism needs CUDA and NCCL", size,
#if defined(SPECULA_HAS_CUDA)
                "NCCL"
#else
                "CUDA"
#endif
  );
}
TpGroup::~TpGroup() = default;
std::string TpGroup::describe() const { return "tensor parallel 1"; }
void TpGroup::abort() {}

#endif

}  // namespace specula
