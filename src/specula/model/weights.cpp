// WeightSource's default slice read.
#include "specula/model/weights.h"

#include <cstring>

#include "specula/core/error.h"

namespace specula {

void copy_slice(const TensorView& t, int dim, int64_t begin, int64_t end, Buffer& out) {
  const Shape& shape = t.shape();
  const int last = shape.rank() - 1;
  SPECULA_CHECK((dim == 0 || dim == last) && begin >= 0 && begin <= end && end <= shape[dim],
                "slice [{}, {}) of dimension {} of a tensor of shape {} is not valid", begin, end, dim, shape.str());
  Shape part = shape;
  part[dim] = end - begin;
  out = Buffer(t.dtype(), part);
  const size_t item = dtype_size(t.dtype());
  const auto* src = static_cast<const unsigned char*>(t.data());
  auto* dst = static_cast<unsigned char*>(out.data());
  if (dim == 0) {
    const size_t row = shape[0] > 0 ? t.nbytes() / static_cast<size_t>(shape[0]) : 0;
    std::memcpy(dst, src + static_cast<size_t>(begin) * row, static_cast<size_t>(end - begin) * row);
    return;
  }
  const int64_t width = shape[last];
  const int64_t rows = width > 0 ? t.numel() / width : 0;
  const size_t bytes = static_cast<size_t>(end - begin) * item;
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(dst + static_cast<size_t>(r) * bytes, src + static_cast<size_t>(r * width + begin) * item, bytes);
  }
}

void WeightSource::read_slice(const std::string& name, const Shape& shape, int dim, int64_t begin, int64_t end,
                              Buffer& out) const {
  copy_slice(get(name, shape), dim, begin, end, out);
}

}  // namespace specula
