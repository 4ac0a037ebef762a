// Greedy tokens under tensor parallelism, on the device: each rank holds the argmax (value and id)
// of its vocabulary part; tp_greedy_combine gives every rank the argmax over the whole vocabulary
// (the larger value, the lower id on ties: greedy_token's order) through one all-reduce of
// ranks x rows x 2 floats in which each rank fills only its own slots (a sum that is an
// all-gather, exact: every other term is zero; ids stay exact in f32 below 2^24).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "specula/core/tensor.h"

namespace specula {

class TpComm;

// ids [rows] (local ids, -1 for none) and values [rows] on this rank's device become the global
// ids and values; vocab_begin: this rank's first id. scratch grows as needed (device memory).
// Every rank calls it with the same rows, in the same order as its other collectives.
void tp_greedy_combine(TpComm& comm, int32_t* ids, float* values, int64_t rows, int64_t vocab_begin, Buffer& scratch,
                       Device device, cudaStream_t s);

}  // namespace specula
