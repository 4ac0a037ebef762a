// Timing speculative cycles on stand-in requests, before any real request arrives: the start-up
// calibration of the auto policy's cost model (issue 50, item 1) and the measurements of
// `bench spec-cost` (item 3). The "off" shape's time is the plain DECODE step's. Each stand-in request gets a request row and KV slots for a context
// of random tokens, which one EXTEND forward fills (with the features the draft head needs) and
// one draft extend turns into a root; then cycles of each shape run over the first bs requests
// exactly as the scheduler runs them (run_cycle, then the draft extend of what they accepted),
// without ever advancing the requests, so every repeat times the same work. Everything taken is
// given back.
#pragma once

#include <cstdint>
#include <vector>

#include "specula/speculative/eagle_worker.h"

namespace specula {

struct SpecTimingOptions {
  std::vector<int> batch_sizes;  // empty: the cost model's buckets up to max_running_requests
  int context_len = 256;         // tokens of KV per stand-in request (clamped to the context)
  int warmup = 1;
  int repeats = 3;               // the median of these is kept
  uint64_t seed = 1;
};

struct CycleTime {
  int batch_size = 0;
  SpecShape shape;
  double seconds = 0;  // one cycle and its draft extend (off: a plain step), host wall clock
};

struct PlainTime {
  int batch_size = 0;
  double seconds = 0;  // one DECODE step of the target alone (graphs where captured)
};

// The largest shape's cycle taken apart, each part run alone and waited for: the target's
// TARGET_VERIFY over the trees, the draft head's tree expansion, and its extend over a cycle's
// worth of pairs (num_draft_tokens per request).
struct PhaseTime {
  int batch_size = 0;
  double verify_s = 0, draft_s = 0, extend_s = 0;
};

struct SpecTimings {
  std::vector<CycleTime> cycles;
  std::vector<PlainTime> plain;
  std::vector<PhaseTime> phases;
  int context_len = 0;
};

// Times every shape of worker.policy() (plain DECODE steps and the largest shape's phases too,
// with details) at each batch size that the target's free request rows and KV slots hold; larger
// sizes are left out.
SpecTimings time_spec_cycles(EagleWorker& worker, ModelRunner& target, const SpecTimingOptions& options,
                             bool details = false);

// The auto policy's priors from time_spec_cycles (the engine calls this at start-up on a GPU).
void calibrate_policy(EagleWorker& worker, ModelRunner& target, const SpecTimingOptions& options);

}  // namespace specula
