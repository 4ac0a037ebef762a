// Shape, TensorView and Buffer.
#include "specula/core/tensor.h"

#include <cstdlib>
#include <cstring>

#include <sys/mman.h>

#include "specula/core/device_memory.h"

namespace specula {

namespace {
constexpr size_t kHugePageBytes = size_t{2} << 20;
}  // namespace

Shape::Shape(std::initializer_list<int64_t> dims) : Shape(std::span<const int64_t>(dims.begin(), dims.size())) {}

Shape::Shape(std::span<const int64_t> dims) {
  SPECULA_CHECK(dims.size() <= kMaxDims, "rank {} is not supported; at most {}", dims.size(), kMaxDims);
  rank_ = static_cast<int>(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    SPECULA_CHECK(dims[i] >= 0, "dimension {} of a shape is negative ({})", i, dims[i]);
    dims_[i] = dims[i];
  }
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= dims_[static_cast<size_t>(i)];
  return n;
}

bool Shape::operator==(const Shape& other) const {
  if (rank_ != other.rank_) return false;
  for (int i = 0; i < rank_; ++i) {
    if ((*this)[i] != other[i]) return false;
  }
  return true;
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < rank_; ++i) s += fmt::format("{}{}", i ? ", " : "", (*this)[i]);
  return s + "]";
}

namespace {
Shape contiguous_strides(const Shape& shape) {
  Shape strides = shape;
  int64_t stride = 1;
  for (int i = shape.rank() - 1; i >= 0; --i) {
    strides[i] = stride;
    stride *= shape[i];
  }
  return strides;
}
}  // namespace

TensorView::TensorView(void* data, DType dtype, Shape shape, Device device)
    : data_(data), dtype_(dtype), device_(device), shape_(shape), strides_(contiguous_strides(shape)) {}

TensorView::TensorView(void* data, DType dtype, Shape shape, Shape strides, Device device)
    : data_(data), dtype_(dtype), device_(device), shape_(shape), strides_(strides) {
  SPECULA_CHECK(shape.rank() == strides.rank(), "shape {} and strides {} differ in rank",
                shape.str(), strides.str());
}

bool TensorView::is_contiguous() const { return strides_ == contiguous_strides(shape_); }

void* TensorView::element_ptr(std::initializer_list<int64_t> index) const {
  SPECULA_CHECK(static_cast<int>(index.size()) == rank(), "index of rank {} into a tensor of rank {}",
                index.size(), rank());
  int64_t offset = 0;
  int dim = 0;
  for (int64_t i : index) {
    SPECULA_CHECK(i >= 0 && i < shape_[dim], "index {} is out of range [0, {}) in dimension {} of {}",
                  i, shape_[dim], dim, str());
    offset += i * strides_[dim];
    ++dim;
  }
  return static_cast<char*>(data_) + offset * static_cast<int64_t>(dtype_size(dtype_));
}

TensorView TensorView::slice(int64_t start, int64_t length) const {
  SPECULA_CHECK(rank() >= 1, "cannot slice a scalar view");
  SPECULA_CHECK(start >= 0 && length >= 0 && start + length <= shape_[0],
                "slice [{}, {}) is out of range for dimension 0 of {}", start, start + length, str());
  Shape shape = shape_;
  shape[0] = length;
  char* base = static_cast<char*>(data_) + start * strides_[0] * static_cast<int64_t>(dtype_size(dtype_));
  return TensorView(base, dtype_, shape, strides_, device_);
}

TensorView TensorView::reshape(Shape shape) const {
  SPECULA_CHECK(is_contiguous(), "reshape of non-contiguous {}", str());
  SPECULA_CHECK(shape.numel() == numel(), "cannot reshape {} to {}", str(), shape.str());
  return TensorView(data_, dtype_, shape, device_);
}

std::string TensorView::str() const {
  return fmt::format("{}{} on {}", dtype_name(dtype_), shape_.str(), device_.str());
}

void check_shape(const TensorView& t, const Shape& expected, std::string_view what) {
  SPECULA_CHECK(t.shape() == expected, "{} has shape {}; expected {}", what, t.shape().str(),
                expected.str());
}

void check_dtype(const TensorView& t, DType expected, std::string_view what) {
  SPECULA_CHECK(t.dtype() == expected, "{} has dtype {}; expected {}", what, dtype_name(t.dtype()),
                dtype_name(expected));
}

void check_device(const TensorView& t, Device expected, std::string_view what) {
  SPECULA_CHECK(t.device() == expected, "{} is on {}; expected {}", what, t.device().str(),
                expected.str());
}

void Buffer::Deleter::operator()(void* p) const {
  if (p == nullptr) return;
  if (device.is_cpu()) {
    std::free(p);
  } else {
    device_free(p, device);
  }
}

Buffer::Buffer(DType dtype, Shape shape, Device device) {
  const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  void* p = nullptr;
  if (device.is_cpu()) {
    // Large buffers (KV caches, weights) are 2 MiB aligned and asked to be backed by huge
    // pages: attention reads KV rows scattered over pages, and with 4 KiB pages nearly every
    // row is a TLB miss. aligned_alloc needs a size that is a multiple of the alignment; never
    // zero, so that an empty Buffer still has a distinct, valid pointer.
    const size_t alignment = bytes >= kHugePageBytes ? kHugePageBytes : 64;
    const size_t rounded = (bytes + alignment - 1) / alignment * alignment;
    p = std::aligned_alloc(alignment, rounded == 0 ? alignment : rounded);
    if (p != nullptr && alignment == kHugePageBytes) madvise(p, rounded, MADV_HUGEPAGE);
    SPECULA_CHECK(p != nullptr, "out of host memory allocating {} bytes for {}{}", bytes,
                  dtype_name(dtype), shape.str());
  } else {
    p = device_malloc(bytes, device);
  }
  storage_ = std::unique_ptr<void, Deleter>(p, Deleter{device});
  view_ = TensorView(p, dtype, shape, device);
}

void Buffer::zero() {
  if (view_.device().is_cpu()) {
    std::memset(view_.data(), 0, nbytes());
  } else {
    device_memset_zero(view_.data(), nbytes(), view_.device());
  }
}

void copy(const TensorView& dst, const TensorView& src) {
  SPECULA_CHECK(dst.shape() == src.shape(), "copy: destination {} and source {} differ in shape",
                dst.str(), src.str());
  SPECULA_CHECK(dst.dtype() == src.dtype(), "copy: destination {} and source {} differ in dtype",
                dst.str(), src.str());
  SPECULA_CHECK(dst.is_contiguous() && src.is_contiguous(), "copy: {} and {} must be contiguous",
                dst.str(), src.str());
  if (dst.device().is_cpu() && src.device().is_cpu()) {
    std::memmove(dst.data(), src.data(), src.nbytes());
  } else {
    device_memcpy(dst.data(), dst.device(), src.data(), src.device(), src.nbytes());
  }
}

}  // namespace specula
