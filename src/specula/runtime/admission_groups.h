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
// they are admitted at once (no request waits for requests that have not arrived).
#pragma once

#include <cstdint>

namespace specula {

class AdmissionGroups {
 public:
  // fixed_group: 0 measures the group size; N >= 1 always waits for N free rows (1: admit as
  // rows free, as without speculation).
  explicit AdmissionGroups(int fixed_group = 0);

  // A step that ran prompts alone: its prompt tokens and wall seconds.
  void observe_prefill(int64_t tokens, double seconds);
  // A decode step (a speculative cycle, or a step with drafting off): its seconds and the rows
  // that finished in it.
  void observe_decode(double seconds, int rows_freed);

  // Whether this step should run without admitting: free_rows rows are free, waiting requests
  // wait, busy_rows rows decode. Counts the deferral; false resets the count.
  bool defer(int free_rows, int64_t waiting, int busy_rows);

  // The group size for a batch of `rows` rows, from the estimates so far (the fixed size when
  // one was given); at least 1.
  int group_size(int rows) const;
  // The fitted fixed part of a prefill step in seconds; 0 until the fit separates one (prompt
  // sizes that spread at least 10% and a positive per-token slope).
  double fixed_seconds() const;
  double cycle_seconds() const { return cycle_s_; }
  double rows_freed_per_cycle() const { return lambda_; }
  // The most decode steps in a row that admission waits: twice the steps a group takes to free
  // at the measured rate, at most kMaxDeferredSteps.
  int max_deferred_steps(int want) const;

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
};

}  // namespace specula
