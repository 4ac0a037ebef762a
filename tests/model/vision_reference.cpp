#include "vision_reference.h"

#include <algorithm>
#include <cmath>

namespace specula::testing {

namespace {

std::vector<float> normal(size_t n, double mean, double stddev, std::mt19937_64& rng) {
  std::normal_distribution<double> dist(mean, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(dist(rng));
  return v;
}

std::vector<double> linear(const std::vector<double>& x, const std::vector<float>& w, const std::vector<float>& b,
                           size_t n, size_t in, size_t out) {
  std::vector<double> y(n * out);
  for (size_t r = 0; r < n; ++r) {
    for (size_t o = 0; o < out; ++o) {
      double s = b[o];
      for (size_t i = 0; i < in; ++i) s += x[r * in + i] * static_cast<double>(w[o * in + i]);
      y[r * out + o] = s;
    }
  }
  return y;
}

std::vector<double> layer_norm(const std::vector<double>& x, const std::vector<float>& w, const std::vector<float>& b,
                               size_t n, size_t width, double eps) {
  std::vector<double> y(x.size());
  for (size_t r = 0; r < n; ++r) {
    double mean = 0, var = 0;
    for (size_t i = 0; i < width; ++i) mean += x[r * width + i];
    mean /= static_cast<double>(width);
    for (size_t i = 0; i < width; ++i) var += (x[r * width + i] - mean) * (x[r * width + i] - mean);
    var /= static_cast<double>(width);
    for (size_t i = 0; i < width; ++i) y[r * width + i] = (x[r * width + i] - mean) / std::sqrt(var + eps) * w[i] + b[i];
  }
  return y;
}

}  // namespace

VisionBlockWeights random_vision_block(int hidden, int heads, int mlp, std::mt19937_64& rng) {
  VisionBlockWeights w;
  w.hidden = hidden;
  w.heads = heads;
  w.mlp = mlp;
  const auto h = static_cast<size_t>(hidden), f = static_cast<size_t>(mlp);
  w.norm1_w = normal(h, 1.0, 0.1, rng);
  w.norm1_b = normal(h, 0.0, 0.1, rng);
  w.qkv_w = normal(3 * h * h, 0.0, 1.0 / std::sqrt(hidden), rng);
  w.qkv_b = normal(3 * h, 0.0, 0.1, rng);
  w.proj_w = normal(h * h, 0.0, 1.0 / std::sqrt(hidden), rng);
  w.proj_b = normal(h, 0.0, 0.1, rng);
  w.norm2_w = normal(h, 1.0, 0.1, rng);
  w.norm2_b = normal(h, 0.0, 0.1, rng);
  w.fc1_w = normal(f * h, 0.0, 1.0 / std::sqrt(hidden), rng);
  w.fc1_b = normal(f, 0.0, 0.1, rng);
  w.fc2_w = normal(h * f, 0.0, 1.0 / std::sqrt(mlp), rng);
  w.fc2_b = normal(h, 0.0, 0.1, rng);
  return w;
}

std::vector<double> reference_vision_block(const VisionBlockWeights& w, const std::vector<float>& x,
                                           const std::vector<VisionGrid>& grids, int merge, double theta) {
  const size_t hidden = static_cast<size_t>(w.hidden), heads = static_cast<size_t>(w.heads);
  const size_t d = hidden / heads, half = d / 2, quarter = d / 4;
  // Each patch's frame (its attention group) and (row, column), from its index in the frame: the
  // frame is walked in merge x merge windows, raster order, and so is each window.
  std::vector<int> group, row, col;
  int frames = 0;
  for (const VisionGrid& g : grids) {
    for (int t = 0; t < g.t; ++t, ++frames) {
      for (int idx = 0; idx < g.h * g.w; ++idx) {
        const int window = idx / (merge * merge), inside = idx % (merge * merge);
        const int windows_per_row = g.w / merge;
        group.push_back(frames);
        row.push_back(window / windows_per_row * merge + inside / merge);
        col.push_back(window % windows_per_row * merge + inside % merge);
      }
    }
  }
  const size_t n = group.size();
  std::vector<double> xd(x.begin(), x.end());

  const std::vector<double> normed = layer_norm(xd, w.norm1_w, w.norm1_b, n, hidden, w.eps);
  const std::vector<double> qkv = linear(normed, w.qkv_w, w.qkv_b, n, hidden, 3 * hidden);
  // Rotary: value j < d/2 pairs with j + d/2; angles j < d/4 follow the row, the next d/4 the column.
  auto rotated = [&](size_t p, size_t which, size_t h) {
    std::vector<double> out(d);
    const double* v = qkv.data() + p * 3 * hidden + which * hidden + h * d;
    for (size_t j = 0; j < half; ++j) {
      const double pos = j < quarter ? row[p] : col[p];
      const double angle = pos * std::pow(theta, -2.0 * static_cast<double>(j % quarter) / static_cast<double>(half));
      out[j] = v[j] * std::cos(angle) - v[j + half] * std::sin(angle);
      out[j + half] = v[j + half] * std::cos(angle) + v[j] * std::sin(angle);
    }
    return out;
  };
  std::vector<double> attn(n * hidden, 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (size_t h = 0; h < heads; ++h) {
    std::vector<std::vector<double>> q(n), k(n);
    for (size_t p = 0; p < n; ++p) {
      q[p] = rotated(p, 0, h);
      k[p] = rotated(p, 1, h);
    }
    for (size_t i = 0; i < n; ++i) {
      // The whole row of the n x n matrix, masked to the query's own frame.
      std::vector<double> s(n, -INFINITY);
      double top = -INFINITY;
      for (size_t j = 0; j < n; ++j) {
        if (group[j] != group[i]) continue;
        double dot = 0;
        for (size_t c = 0; c < d; ++c) dot += q[i][c] * k[j][c];
        s[j] = dot * scale;
        top = std::max(top, s[j]);
      }
      double denom = 0;
      for (size_t j = 0; j < n; ++j) denom += std::isinf(s[j]) ? 0.0 : std::exp(s[j] - top);
      for (size_t j = 0; j < n; ++j) {
        if (std::isinf(s[j])) continue;
        const double pj = std::exp(s[j] - top) / denom;
        const double* v = qkv.data() + j * 3 * hidden + 2 * hidden + h * d;
        for (size_t c = 0; c < d; ++c) attn[i * hidden + h * d + c] += pj * v[c];
      }
    }
  }
  const std::vector<double> proj = linear(attn, w.proj_w, w.proj_b, n, hidden, hidden);
  for (size_t i = 0; i < xd.size(); ++i) xd[i] += proj[i];
  const std::vector<double> normed2 = layer_norm(xd, w.norm2_w, w.norm2_b, n, hidden, w.eps);
  std::vector<double> up = linear(normed2, w.fc1_w, w.fc1_b, n, hidden, static_cast<size_t>(w.mlp));
  for (double& u : up) u = u / (1.0 + std::exp(-1.702 * u));
  const std::vector<double> down = linear(up, w.fc2_w, w.fc2_b, n, static_cast<size_t>(w.mlp), hidden);
  for (size_t i = 0; i < xd.size(); ++i) xd[i] += down[i];
  return xd;
}

double relative_max_error(const std::vector<float>& got, const std::vector<double>& want) {
  double scale = 1.0, err = 0.0;
  for (double v : want) scale = std::max(scale, std::abs(v));
  for (size_t i = 0; i < want.size(); ++i) err = std::max(err, std::abs(static_cast<double>(got[i]) - want[i]));
  return got.size() == want.size() ? err / scale : INFINITY;
}

}  // namespace specula::testing
