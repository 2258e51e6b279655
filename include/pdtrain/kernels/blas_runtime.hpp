#pragma once
// What the BLAS library does at run time: which CPU kernel OpenBLAS picked, whether that is a
// known misdetection worth a warning, and how many threads it uses. Works with any BLAS;
// the OpenBLAS-only parts answer "" / do nothing elsewhere.
#include <string>
#include <string_view>

namespace pdtrain::kernels {

// OpenBLAS's core name ("SkylakeX", "Haswell", "Prescott", ...), or "" for another BLAS.
std::string blas_corename();

// Whether this CPU supports AVX-512 Foundation (false on non-x86).
bool cpu_has_avx512f();

// The decision, as a pure function for tests: a one-line hint when an AVX-512 CPU runs an
// OpenBLAS core without AVX-512 kernels (OpenBLAS 0.3.21 detects some Xeons as 'Prescott'),
// else "". An empty corename (not OpenBLAS) never gives a hint.
std::string blas_misdetection_hint(std::string_view corename, bool has_avx512f);

// The same for this process's BLAS and CPU.
std::string blas_misdetection_hint();

// Sets OpenBLAS's thread count; does nothing with another BLAS.
void set_blas_threads(int n);

}  // namespace pdtrain::kernels
