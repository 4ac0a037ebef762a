// The CPU attention kernel for any processor (baseline instruction set).
#define SPECULA_CPU_ISA_NS cpu_generic
#include "specula/attention/cpu/tile_kernel_impl.h"
