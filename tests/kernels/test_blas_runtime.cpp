// The OpenBLAS misdetection hint is a pure decision on (corename, has AVX-512).
#include <gtest/gtest.h>

#include "pdtrain/kernels/blas_runtime.hpp"

namespace pdtrain::kernels {
namespace {

TEST(BlasRuntime, HintWhenAvx512CpuRunsPrescottCore) {
  const std::string hint = blas_misdetection_hint("Prescott", true);
  EXPECT_NE(hint.find("'Prescott'"), std::string::npos) << hint;
  EXPECT_NE(hint.find("OPENBLAS_CORETYPE=SkylakeX"), std::string::npos) << hint;
  EXPECT_EQ(hint.find('\n'), std::string::npos) << "the hint is one line";
}

TEST(BlasRuntime, NoHintForAvx512Cores) {
  EXPECT_EQ(blas_misdetection_hint("SkylakeX", true), "");
  EXPECT_EQ(blas_misdetection_hint("skylakex", true), "");  // case-insensitive
  EXPECT_EQ(blas_misdetection_hint("CooperLake", true), "");
  EXPECT_EQ(blas_misdetection_hint("SapphireRapids", true), "");
}

TEST(BlasRuntime, NoHintWithoutAvx512OrWithoutOpenBlas) {
  EXPECT_EQ(blas_misdetection_hint("Haswell", false), "");
  EXPECT_EQ(blas_misdetection_hint("Prescott", false), "");
  EXPECT_EQ(blas_misdetection_hint("", true), "");  // another BLAS: nothing to say
}

// The live queries only have to work; their answers depend on the machine.
TEST(BlasRuntime, LiveQueriesRun) {
  const std::string core = blas_corename();
  const std::string hint = blas_misdetection_hint();
  EXPECT_EQ(hint, blas_misdetection_hint(core, cpu_has_avx512f()));
  set_blas_threads(1);
  RecordProperty("blas_corename", core);
}

}  // namespace
}  // namespace pdtrain::kernels
