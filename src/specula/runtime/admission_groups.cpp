#include "specula/runtime/admission_groups.h"

#include <algorithm>
#include <cmath>

#include "specula/core/error.h"

namespace specula {

namespace {
// Weight of the newest prefill step in the line's sums: about the last 20 steps count, so the fit
// follows a change of load without one odd step moving it far.
constexpr double kPrefillAlpha = 0.05;
// Weight of the newest decode step in the cycle time and the rows freed per cycle: rows free 0, 1
// or a few per cycle, so the rate is an average over about 20 cycles.
constexpr double kDecodeAlpha = 0.05;
// Prompt sizes spreading less than this (relative standard deviation) leave the intercept
// unidentified.
constexpr double kMinRelativeSpread = 0.1;
}  // namespace

AdmissionGroups::AdmissionGroups(int fixed_group) : fixed_group_(fixed_group) {
  SPECULA_CHECK(fixed_group >= 0, "speculative_admission_group {} is not valid; it must be >= 1, or 0 to measure it",
                fixed_group);
}

void AdmissionGroups::observe_prefill(int64_t tokens, double seconds) {
  if (tokens <= 0 || !(seconds >= 0)) return;
  const double x = static_cast<double>(tokens);
  const double keep = 1.0 - kPrefillAlpha;
  w_ = keep * w_ + 1.0;
  sx_ = keep * sx_ + x;
  sy_ = keep * sy_ + seconds;
  sxx_ = keep * sxx_ + x * x;
  sxy_ = keep * sxy_ + x * seconds;
}

void AdmissionGroups::observe_decode(double seconds, int rows_freed) {
  if (!(seconds > 0)) return;
  if (decode_steps_++ == 0) {
    cycle_s_ = seconds;
    lambda_ = rows_freed;
    return;
  }
  cycle_s_ += kDecodeAlpha * (seconds - cycle_s_);
  lambda_ += kDecodeAlpha * (rows_freed - lambda_);
}

double AdmissionGroups::fixed_seconds() const {
  if (w_ <= 0) return 0;
  const double mean_x = sx_ / w_;
  const double var_x = sxx_ / w_ - mean_x * mean_x;
  if (!(mean_x > 0) || var_x < (kMinRelativeSpread * mean_x) * (kMinRelativeSpread * mean_x)) return 0;
  const double det = w_ * sxx_ - sx_ * sx_;
  const double slope = (w_ * sxy_ - sx_ * sy_) / det;
  const double intercept = (sy_ * sxx_ - sx_ * sxy_) / det;
  // A slope at or below zero means the sizes did not explain the times: no fixed part is separated.
  if (!(slope > 0) || !(intercept > 0)) return 0;
  return intercept;
}

double AdmissionGroups::cost_per_request(int g, double fixed_s, double cycle_s, double lambda, int rows) {
  return fixed_s / g + g * cycle_s / (2.0 * lambda * rows);
}

int AdmissionGroups::best_group(double fixed_s, double cycle_s, double lambda, int rows) {
  if (!(fixed_s > 0) || !(cycle_s > 0) || !(lambda > 0) || rows <= 1) return 1;
  const double g = std::sqrt(2.0 * lambda * rows * fixed_s / cycle_s);
  const int lo = static_cast<int>(std::clamp(std::floor(g), 1.0, static_cast<double>(rows)));
  const int hi = std::clamp(lo + 1, 1, rows);
  return cost_per_request(hi, fixed_s, cycle_s, lambda, rows) < cost_per_request(lo, fixed_s, cycle_s, lambda, rows)
             ? hi
             : lo;
}

int AdmissionGroups::group_size(int rows) const {
  if (fixed_group_ > 0) return fixed_group_;
  return best_group(fixed_seconds(), cycle_s_, lambda_, rows);
}

int AdmissionGroups::max_deferred_steps(int want) const {
  if (fixed_group_ > 0 && !(lambda_ > 0)) return kMaxDeferredSteps;
  if (!(lambda_ > 0)) return 0;
  const double steps = std::ceil(2.0 * want / lambda_);
  return static_cast<int>(std::min<double>(steps, kMaxDeferredSteps));
}

bool AdmissionGroups::defer(int free_rows, int64_t waiting, int busy_rows) {
  const int rows = busy_rows + static_cast<int>(std::min<int64_t>(free_rows, waiting));
  const int want = std::min(group_size(rows), busy_rows + free_rows);
  last_group_ = want;
  const bool wait = busy_rows > 0 && free_rows > 0 && waiting > free_rows && free_rows < want &&
                    deferred_ < max_deferred_steps(want);
  deferred_ = wait ? deferred_ + 1 : 0;
  return wait;
}

}  // namespace specula
