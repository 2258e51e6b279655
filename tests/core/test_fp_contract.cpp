// The build keeps a*b+c unfused (-ffp-contract=off) even where FMA instructions are available.
#include <gtest/gtest.h>

#include <cmath>

#include "pdtrain/core/fp_contract_probe.hpp"

namespace pdtrain {
namespace {

TEST(FpContract, ProjectCodeKeepsMultiplyAndAddApart) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("fma")) GTEST_SKIP() << "no FMA instructions to run the probe with";
#endif
  // a*b = 1 + 2^-11 + 2^-24 exactly; rounded to float (a tie, to even) it is 1 + 2^-11. So
  // round(round(a*b) + c) = 0, while the fused fma(a, b, c) keeps the 2^-24.
  const float a = 1.0f + 0x1p-12f, b = a, c = -(1.0f + 0x1p-11f);
  ASSERT_EQ(std::fma(a, b, c), 0x1p-24f);
  volatile float product = a * b;  // stored, so rounded here whatever this file's flags
  ASSERT_EQ(product + c, 0.0f);
  EXPECT_EQ(multiply_add_with_fma_enabled(a, b, c), 0.0f)
      << "a*b+c was fused into an FMA: the build lost -ffp-contract=off";
}

}  // namespace
}  // namespace pdtrain
