// The CPU attention kernel for AVX-512 processors (compiled with -mavx512f and friends; chosen
// at run time by best_cpu_isa()).
#define SPECULA_CPU_ISA_NS cpu_avx512
#include "specula/attention/cpu/tile_kernel_impl.h"
