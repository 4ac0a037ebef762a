// TensorView (non-owning: data, dtype, device, shape, strides) and Buffer (owning, contiguous).
// Strides are in elements. Views are cheap values passed everywhere; Buffers own host memory
// (64-byte aligned, for AVX-512) or device memory (cudaMalloc) and hand out views.
#pragma once

#include <utility>
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>

#include "specula/core/device.h"
#include "specula/core/dtype.h"
#include "specula/core/error.h"

namespace specula {

inline constexpr int kMaxDims = 6;

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(std::span<const int64_t> dims);

  int rank() const { return rank_; }
  int64_t operator[](int i) const { return dims_[static_cast<size_t>(i)]; }
  int64_t& operator[](int i) { return dims_[static_cast<size_t>(i)]; }
  int64_t numel() const;
  bool operator==(const Shape& other) const;
  std::string str() const;  // "[2, 3, 4]"

 private:
  std::array<int64_t, kMaxDims> dims_{};
  int rank_ = 0;
};

class TensorView {
 public:
  TensorView() = default;
  // A contiguous (row-major) view.
  TensorView(void* data, DType dtype, Shape shape, Device device = Device::cpu());
  TensorView(void* data, DType dtype, Shape shape, Shape strides, Device device);

  void* data() const { return data_; }
  template <typename T>
  T* data_as() const { return static_cast<T*>(data_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int rank() const { return shape_.rank(); }
  int64_t size(int dim) const { return shape_[dim]; }
  int64_t stride(int dim) const { return strides_[dim]; }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool empty() const { return data_ == nullptr || numel() == 0; }
  bool defined() const { return data_ != nullptr; }
  bool is_contiguous() const;

  // Pointer to the element at the given multi-index (rank entries).
  void* element_ptr(std::initializer_list<int64_t> index) const;
  // Sub-range [start, start + length) along dim 0.
  TensorView slice(int64_t start, int64_t length) const;
  // Same data, new shape; requires contiguity and equal numel.
  TensorView reshape(Shape shape) const;
  std::string str() const;  // "bf16[4, 32, 128] on cpu"

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::f32;
  Device device_{};
  Shape shape_{};
  Shape strides_{};
};

// Checks used at API boundaries; each throws specula::Error naming `what` and both sides.
void check_shape(const TensorView& t, const Shape& expected, std::string_view what);
void check_dtype(const TensorView& t, DType expected, std::string_view what);
void check_device(const TensorView& t, Device expected, std::string_view what);

class Buffer {
 public:
  Buffer() = default;
  Buffer(DType dtype, Shape shape, Device device = Device::cpu());
  // A moved-from Buffer is empty: its view no longer points at the storage it gave away.
  Buffer(Buffer&& other) noexcept : storage_(std::move(other.storage_)), view_(other.view_) { other.view_ = {}; }
  Buffer& operator=(Buffer&& other) noexcept {
    storage_ = std::move(other.storage_);
    view_ = other.view_;
    other.view_ = {};
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  TensorView view() const { return view_; }
  operator TensorView() const { return view_; }  // NOLINT: a Buffer is usable wherever a view is
  void* data() const { return view_.data(); }
  template <typename T>
  T* data_as() const { return view_.data_as<T>(); }
  DType dtype() const { return view_.dtype(); }
  Device device() const { return view_.device(); }
  const Shape& shape() const { return view_.shape(); }
  int64_t numel() const { return view_.numel(); }
  size_t nbytes() const { return view_.nbytes(); }

  // Sets every byte to zero (host or device).
  void zero();

 private:
  struct Deleter {
    Device device;
    void operator()(void* p) const;
  };
  std::unique_ptr<void, Deleter> storage_{nullptr, Deleter{}};
  TensorView view_;
};

// Copies between views of equal shape, dtype and contiguity, across host and device.
void copy(const TensorView& dst, const TensorView& src);

}  // namespace specula
