// NcclApi: dlopen and dlsym, once.
#include "specula/parallel/nccl_api.h"

#include <dlfcn.h>

#include <mutex>
#include <string>

#include "specula/core/error.h"

namespace specula {

namespace {

template <typename Fn>
void bind(void* library, const char* name, Fn& fn) {
  fn = reinterpret_cast<Fn>(dlsym(library, name));
  SPECULA_CHECK(fn != nullptr, "the NCCL library has no {} ({})", name, dlerror());
}

}  // namespace

const NcclApi& nccl_api() {
  static NcclApi api;
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    void* library = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
#ifdef SPECULA_NCCL_LIBRARY
    if (library == nullptr) library = dlopen(SPECULA_NCCL_LIBRARY, RTLD_NOW | RTLD_LOCAL);
#endif
    if (library == nullptr) {
      const char* why = dlerror();
      error = why != nullptr ? why : "unknown error";
      return;
    }
    try {
      bind(library, "ncclCommInitAll", api.comm_init_all);
      bind(library, "ncclAllReduce", api.all_reduce);
      bind(library, "ncclCommDestroy", api.comm_destroy);
      bind(library, "ncclCommAbort", api.comm_abort);
      bind(library, "ncclGetErrorString", api.error_string);
      bind(library, "ncclGetVersion", api.get_version);
      bind(library, "ncclGroupStart", api.group_start);
      bind(library, "ncclGroupEnd", api.group_end);
    } catch (const Error& e) {
      error = e.what();
      api = {};
    }
  });
  SPECULA_CHECK(api.all_reduce != nullptr,
                "tensor parallelism needs NCCL, which could not be loaded: {} (install libnccl2, or put the directory "
                "of libnccl.so.2 on LD_LIBRARY_PATH)", error);
  return api;
}

}  // namespace specula
