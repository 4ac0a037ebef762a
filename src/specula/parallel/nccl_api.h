// NCCL, loaded when tensor parallelism first needs it (dlopen of libnccl.so.2, else the library
// found at configure time): the library maps about 220 MB, which every run on one GPU or the CPU
// would otherwise pay at start-up. Only the calls TpGroup makes.
#pragma once

#include <nccl.h>

namespace specula {

struct NcclApi {
  decltype(&ncclCommInitAll) comm_init_all = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclCommAbort) comm_abort = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
};

// The loaded library's entry points; throws specula::Error naming the library and dlerror()
// when it cannot be loaded.
const NcclApi& nccl_api();

}  // namespace specula
