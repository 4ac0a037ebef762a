// CPU decoder building blocks.
#include "specula/model/cpu_ops.h"

#include <cblas.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "specula/core/error.h"

namespace specula {

void reserve_cpu_blas_buffers() {
  // OpenBLAS's BUFFER_SIZE (128 MiB on x86-64) plus its alignment slack, per thread and one for
  // the calling thread.
  constexpr size_t kBufferBytes = (size_t{128} << 20) + (size_t{64} << 10);
  const int threads = std::max(1, openblas_get_num_threads());
  const size_t need = kBufferBytes * static_cast<size_t>(threads + 1);
  rlimit limit{};
  if (getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    // Address space, not memory, is what the limit counts: a PROT_NONE mapping probes it.
    void* probe = ::mmap(nullptr, need, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    SPECULA_CHECK(probe != MAP_FAILED,
                  "too little address space: OpenBLAS needs {} MiB for its {} threads' work buffers and the "
                  "address-space limit (ulimit -v {} KiB) leaves less; raise it or set OPENBLAS_NUM_THREADS=1",
                  need >> 20, threads, limit.rlim_cur >> 10);
    ::munmap(probe, need);
  }
  // A product large enough for OpenBLAS to split over all of its threads.
  constexpr int n = 256;
  std::vector<float> a(static_cast<size_t>(n) * n, 0.5f), b(a.size(), 0.25f), c(a.size());
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  SPECULA_ASSERT(c[0] == 0.125f * n);
}

void cpu_linear(const float* x, const std::vector<float>& w, float* y, int64_t n, int in, int out) {
  // One row (decode at batch 1) goes through sgemv, which streams the weights; sgemm's packing is
  // overhead for a single row.
  if (n == 1) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, out, in, 1.0f, w.data(), in, x, 1, 0.0f, y, 1);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n), out, in, 1.0f, x, in, w.data(), in, 0.0f, y,
              out);
}

void cpu_matmul(const float* x, int64_t ldx, const float* w, int64_t ldw, bool w_transposed, float* y, int64_t ldy,
                int64_t n, int in, int out) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, w_transposed ? CblasTrans : CblasNoTrans, static_cast<int>(n), out, in, 1.0f,
              x, static_cast<int>(ldx), w, static_cast<int>(ldw), 0.0f, y, static_cast<int>(ldy));
}

void cpu_add_bias(float* y, const std::vector<float>& bias, int64_t n) {
  const auto width = static_cast<int64_t>(bias.size());
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t i = 0; i < width; ++i) y[r * width + i] += bias[static_cast<size_t>(i)];
  }
}

void cpu_rms_norm(const float* x, const std::vector<float>& w, float* y, int64_t n, int hidden, float eps) {
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x + r * hidden;
    float sum = 0.0f;
    for (int i = 0; i < hidden; ++i) sum += xr[i] * xr[i];
    // The row's scale is computed before the row is written, so y may alias x.
    const float inv = 1.0f / std::sqrt(sum / static_cast<float>(hidden) + eps);
    for (int i = 0; i < hidden; ++i) y[r * hidden + i] = w[static_cast<size_t>(i)] * (xr[i] * inv);
  }
}

void cpu_silu_mul(std::vector<float>& gate, const std::vector<float>& up) {
  for (size_t i = 0; i < gate.size(); ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void cpu_final_logits(const float* x, const ForwardBatch& batch, bool all_tokens, const std::vector<float>& norm,
                      const std::vector<float>& lm_head, int hidden, int vocab, float eps, std::vector<float>& logits) {
  std::vector<int64_t> rows;
  if (all_tokens) {
    for (int64_t t = 0; t < batch.num_tokens(); ++t) rows.push_back(t);
  } else {
    int64_t end = 0;
    for (int r = 0; r < batch.batch_size; ++r) {
      end += batch.query_len(r);
      rows.push_back(end - 1);
    }
  }
  std::vector<float> selected(rows.size() * static_cast<size_t>(hidden));
  for (size_t r = 0; r < rows.size(); ++r) {
    cpu_rms_norm(x + rows[r] * hidden, norm, selected.data() + r * static_cast<size_t>(hidden), 1, hidden, eps);
  }
  logits.resize(rows.size() * static_cast<size_t>(vocab));
  cpu_linear(selected.data(), lm_head, logits.data(), static_cast<int64_t>(rows.size()), hidden, vocab);
}

CpuRope::CpuRope(std::span<const int32_t> positions, const std::vector<float>& inv_freq, float attention_factor)
    : n_(static_cast<int64_t>(positions.size())), half_(static_cast<int>(inv_freq.size())) {
  cos_.resize(static_cast<size_t>(n_ * half_));
  sin_.resize(cos_.size());
  for (int64_t t = 0; t < n_; ++t) {
    const float pos = static_cast<float>(positions[static_cast<size_t>(t)]);
    for (int i = 0; i < half_; ++i) {
      const float angle = pos * inv_freq[static_cast<size_t>(i)];
      cos_[static_cast<size_t>(t * half_ + i)] = std::cos(angle) * attention_factor;
      sin_[static_cast<size_t>(t * half_ + i)] = std::sin(angle) * attention_factor;
    }
  }
}

void CpuRope::apply(float* data, int heads, int64_t token_stride, int head_stride, bool interleaved) const {
  // Element i of the pair rotated by angle i sits at a, its partner at a + partner.
  const int step = interleaved ? 2 : 1, partner = interleaved ? 1 : half_;
  for (int64_t t = 0; t < n_; ++t) {
    const float* cs = cos_.data() + t * half_;
    const float* sn = sin_.data() + t * half_;
    for (int hd = 0; hd < heads; ++hd) {
      float* v = data + t * token_stride + static_cast<int64_t>(hd) * head_stride;
      for (int i = 0; i < half_; ++i) {
        float* x = v + i * step;
        const float a = x[0], b = x[partner];
        x[0] = a * cs[i] - b * sn[i];
        x[partner] = b * cs[i] + a * sn[i];
      }
    }
  }
}

}  // namespace specula
