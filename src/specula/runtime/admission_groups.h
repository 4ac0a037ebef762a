// Admission in groups while speculating (issue 50). A speculative cycle is a step of its own, so
// every prompt admitted while requests decode runs in a prefill step of its own (the target's
// extend and the draft's), during which no row advances. When rows free one or two at a time,
// admitting each as it frees pays a prefill step's fixed part (launches, the draft's extend,
// host work: most of a short prompt's step on a GPU) once per one or two requests; holding free
// rows empty until a group is ready pays that part once per group, at the price of the rows left
// idle meanwhile. With F the fixed seconds of a prefill step, C the seconds of a cycle, R the
// rows of the batch and lambda the rows freed per cycle, a group of g costs per request
//   F / g  +  g C / (2 lambda R)
// (the prefill's fixed part shared by g; on average g/2 rows idle for g/lambda cycles, a row-cycle
// worth C/R seconds of the batch), least at g = sqrt(2 lambda R F / C) (the economic order
// quantity). F is the intercept of a line fitted to prefill steps' seconds against their prompt
// tokens (exponentially weighted least squares), so per-token work (all of it on a CPU) does not
// count; C and lambda are exponential averages over decode steps.
//
// Only rows are waited for: when the queue holds no more requests than there are free rows,
// they are admitted at once (no request waits for requests that have not arrived). The scheduler
// also admits at once when the KV cache, not rows, limited the last admission, after a
// retraction, and when the queue nears its limit (a full queue would refuse requests that free
// rows could take).
//
// A step's wall time carries GPU work queued by the step before it that the host did not wait
// for (a cycle's last draft extend); a prefill step after a cycle counts it, which moves a few
// tenths of a millisecond from C to F at batch 64 on the H200.
//
// Sizes that spread too little identify no intercept, and the groups then fall back to 1 until
// they spread again. Keeping the last identified intercept instead was measured worse on the
// H200 (docs/performance-log.md, "admission groups"): it kept intercepts of 1.5-3 ms where the
// steps' own line through their averages gave about 0.45 ms, formed groups of 11-18, and the
// larger prefill steps cost more than the line says (batch 64: 4.0 ms for 6.5 prompts, 23 ms for
// 18).
#pragma once

#include <cstdint>

namespace specula {

class AdmissionGroups {
 public:
  // fixed_group: 0 measures the group size; N >= 1 waits for N free rows (capped at the batch
  // and at max_deferred_steps; 1: admit as rows free, as without speculation).
  explicit AdmissionGroups(int fixed_group = 0);

  // A step that ran prompts alone: its prompt tokens and wall seconds.
  void observe_prefill(int64_t tokens, double seconds);
  // A decode step (a speculative cycle, or a step with drafting off): its seconds and the rows
  // that finished in it.
  void observe_decode(double seconds, int rows_freed);

  // Whether this step should run without admitting: free_rows rows are free, waiting requests
  // wait, busy_rows rows decode. Counts the deferral; false resets the count.
  bool defer(int free_rows, int64_t waiting, int busy_rows);
  // A step that admits without asking (the scheduler's own reasons): the count restarts.
  void admit() { deferred_ = 0; }

  // The group size for a batch of `rows` rows, from the estimates so far (the fixed size when
  // one was given); at least 1.
  int group_size(int rows) const;
  // The fitted fixed part of a prefill step in seconds; 0 unless the fit separates one (prompt
  // sizes that spread at least 10% and a positive per-token slope).
  double fixed_seconds() const;
  double cycle_seconds() const { return cycle_s_; }
  double rows_freed_per_cycle() const { return lambda_; }
  // The most decode steps in a row that admission waits: twice the steps a group takes to free
  // at the measured rate, at most kMaxDeferredSteps (a fixed group before any row freed:
  // kMaxDeferredSteps; a measured one then never waits).
  int max_deferred_steps(int want) const;
  // The group size the last defer() asked for (0 before any).
  int last_group() const { return last_group_; }

  // Cost per admitted request, in seconds, of groups of g (the model above), for tests and logs.
  static double cost_per_request(int g, double fixed_s, double cycle_s, double lambda, int rows);
  // The integer group that minimises cost_per_request (at least 1, at most rows).
  static int best_group(double fixed_s, double cycle_s, double lambda, int rows);

  static constexpr int kMaxDeferredSteps = 64;

 private:
  int fixed_group_;
  // Exponentially weighted sums for the line seconds = a + b tokens.
  double w_ = 0, sx_ = 0, sy_ = 0, sxx_ = 0, sxy_ = 0;
  double cycle_s_ = 0;
  double lambda_ = 0;
  int64_t decode_steps_ = 0;
  int deferred_ = 0;
  int last_group_ = 0;
};

}  // namespace specula
