// Shape, TensorView and Buffer: layout arithmetic, slicing, checks and their messages.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>

#include "specula/core/tensor.h"

namespace specula {
namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Tensor, ContiguousStridesAndElementAddress) {
  Buffer b(DType::bf16, {3, 4, 5});
  const TensorView v = b.view();
  EXPECT_EQ(v.numel(), 60);
  EXPECT_EQ(v.nbytes(), 120u);
  EXPECT_EQ(v.stride(0), 20);
  EXPECT_EQ(v.stride(1), 5);
  EXPECT_EQ(v.stride(2), 1);
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(static_cast<char*>(v.element_ptr({2, 1, 3})) - static_cast<char*>(v.data()), (2 * 20 + 5 + 3) * 2);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 64, 0u);
  EXPECT_EQ(v.str(), "bf16[3, 4, 5] on cpu");
}

TEST(Tensor, SliceAndReshape) {
  Buffer b(DType::f32, {6, 4});
  for (int i = 0; i < 24; ++i) b.data_as<float>()[i] = static_cast<float>(i) * 1.5f;
  const TensorView s = b.view().slice(2, 3);
  EXPECT_EQ(s.shape(), (Shape{3, 4}));
  EXPECT_EQ(*static_cast<float*>(s.element_ptr({1, 2})), 14.0f * 1.5f);
  const TensorView r = b.view().reshape({2, 3, 4});
  EXPECT_EQ(*static_cast<float*>(r.element_ptr({1, 2, 3})), 23.0f * 1.5f);
  EXPECT_NE(error_of([&] { b.view().slice(5, 2); }).find("out of range"), std::string::npos);
  EXPECT_NE(error_of([&] { b.view().reshape({5, 5}); }).find("cannot reshape"), std::string::npos);
  EXPECT_NE(error_of([&] { b.view().element_ptr({6, 0}); }).find("index 6"), std::string::npos);
}

TEST(Tensor, ChecksNameBothSides) {
  Buffer b(DType::f16, {2, 8});
  const std::string shape_msg = error_of([&] { check_shape(b, {2, 9}, "q"); });
  EXPECT_NE(shape_msg.find("q has shape [2, 8]; expected [2, 9]"), std::string::npos) << shape_msg;
  const std::string dtype_msg = error_of([&] { check_dtype(b, DType::bf16, "k"); });
  EXPECT_NE(dtype_msg.find("k has dtype f16; expected bf16"), std::string::npos) << dtype_msg;
}

TEST(Tensor, CopyAndZero) {
  Buffer a(DType::i32, {10});
  Buffer b(DType::i32, {10});
  for (int i = 0; i < 10; ++i) a.data_as<int32_t>()[i] = 7 * i + 3;
  copy(b, a);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(b.data_as<int32_t>()[i], 7 * i + 3);
  b.zero();
  for (int i = 0; i < 10; ++i) EXPECT_EQ(b.data_as<int32_t>()[i], 0);
  Buffer c(DType::i64, {10});
  EXPECT_NE(error_of([&] { copy(c, a); }).find("differ in dtype"), std::string::npos);
}

TEST(Tensor, CudaBufferWithoutCudaIsAClearError) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present";
  const std::string msg = error_of([] { Buffer b(DType::f32, {4}, Device::cuda(0)); });
  EXPECT_NE(msg.find("cuda:0"), std::string::npos) << msg;
}

}  // namespace
}  // namespace specula
