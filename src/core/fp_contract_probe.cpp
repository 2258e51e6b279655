#include "pdtrain/core/fp_contract_probe.hpp"

// x86 needs the FMA extension enabled for this function; other 64-bit ISAs (AArch64) always
// have a fused multiply-add.
#if defined(__x86_64__) || defined(__i386__)
#define PDTRAIN_WITH_FMA __attribute__((target("fma")))
#else
#define PDTRAIN_WITH_FMA
#endif

namespace pdtrain {

PDTRAIN_WITH_FMA float multiply_add_with_fma_enabled(float a, float b, float c) {
  return a * b + c;
}

}  // namespace pdtrain
