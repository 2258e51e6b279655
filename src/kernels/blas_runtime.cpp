#include "pdtrain/kernels/blas_runtime.hpp"

#include <algorithm>
#include <array>
#include <cctype>

// OpenBLAS extensions, declared weak so that any other BLAS still links: then they are null.
extern "C" {
__attribute__((weak)) char* openblas_get_corename(void);
__attribute__((weak)) void openblas_set_num_threads(int num_threads);
}

namespace pdtrain::kernels {

namespace {

std::string lowercase(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

// OpenBLAS cores whose SGEMM/DGEMM kernels use AVX-512.
bool is_avx512_core(std::string_view corename) {
  constexpr std::array<std::string_view, 3> kAvx512Cores = {"skylakex", "cooperlake",
                                                            "sapphirerapids"};
  const std::string name = lowercase(corename);
  return std::any_of(kAvx512Cores.begin(), kAvx512Cores.end(),
                     [&](std::string_view core) { return name.find(core) != std::string::npos; });
}

}  // namespace

std::string blas_corename() {
  if (openblas_get_corename == nullptr) return "";
  const char* name = openblas_get_corename();
  return name != nullptr ? name : "";
}

bool cpu_has_avx512f() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") != 0;
#else
  return false;
#endif
}

std::string blas_misdetection_hint(std::string_view corename, bool has_avx512f) {
  if (corename.empty() || !has_avx512f || is_avx512_core(corename)) return "";
  return "OpenBLAS detected core '" + std::string(corename) +
         "' but this CPU has AVX-512: export OPENBLAS_CORETYPE=SkylakeX for ~5x faster SGEMM";
}

std::string blas_misdetection_hint() {
  return blas_misdetection_hint(blas_corename(), cpu_has_avx512f());
}

void set_blas_threads(int n) {
  if (openblas_set_num_threads != nullptr) openblas_set_num_threads(n);
}

}  // namespace pdtrain::kernels
