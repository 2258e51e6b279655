#pragma once
// A build check, not a kernel. Results must be the same bits on every machine and for every
// SIMD width, so a*b+c must stay two rounded operations. GCC fuses it into one multiply-add
// (one rounding) wherever FMA instructions are enabled -- with -march=native on a cluster
// build, or a target attribute -- unless the build says -ffp-contract=off (CMakeLists.txt).
// This function is compiled like all project code, with FMA instructions enabled;
// tests/core/test_fp_contract.cpp checks that it was not fused.
namespace pdtrain {

float multiply_add_with_fma_enabled(float a, float b, float c);

}  // namespace pdtrain
