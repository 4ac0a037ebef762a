// Device parsing and naming.
#include <gtest/gtest.h>

#include "specula/core/device.h"
#include "specula/core/error.h"

namespace specula {
namespace {

TEST(Device, ParseAndPrint) {
  EXPECT_EQ(parse_device("cpu"), Device::cpu());
  EXPECT_EQ(parse_device("cuda"), Device::cuda(0));
  EXPECT_EQ(parse_device("cuda:3"), Device::cuda(3));
  EXPECT_EQ(Device::cuda(2).str(), "cuda:2");
  EXPECT_EQ(Device::cpu().str(), "cpu");
  for (const char* bad : {"gpu", "cuda:", "cuda:-1", "cuda:1x", ""}) {
    try {
      parse_device(bad);
      FAIL() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("expected cpu, cuda or cuda:N"), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace specula
