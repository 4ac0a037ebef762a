// The unnormalised softmax weights a sampler draws from, over a whole vocabulary row at once.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

namespace specula {

// w[i] = exp((x[i] - top) / temperature) in float (0 where x[i] is -inf or the weight underflows),
// returns their sum in double. top >= every finite x[i]; temperature > 0; x holds no NaN or +inf.
// Compiled apart with the vector math library (glibc's libmvec): a 128k-token row takes tens of
// microseconds instead of a millisecond of scalar exp calls.
// block_sums (optional): the sum of each kSoftmaxBlock weights, in order, for a draw's search.
constexpr size_t kSoftmaxBlock = 1024;
double softmax_weights(std::span<const float> x, float top, float temperature, std::span<float> w,
                       std::vector<double>* block_sums = nullptr);
// The largest value of x (x holds no NaN).
float row_max(std::span<const float> x);
// What a logit row holds: whether every value is finite or -inf (no NaN, no +inf), and whether
// any is finite. A grammar's masked row (-inf outside what it allows) is sane as it is.
struct RowValues {
  bool sane;
  bool any_finite;
};
RowValues row_values(std::span<const float> x);

}  // namespace specula
