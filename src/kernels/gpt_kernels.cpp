// The kernels are templates in the header; instantiating them here for the default execution
// space in both precisions makes the library build compile every one of them (with -Wall
// -Wextra), even those no test or caller uses yet.
#include "pdtrain/kernels/gpt_kernels.hpp"

namespace pdtrain::kernels {

using Exec = Kokkos::DefaultExecutionSpace;
using I32 = std::int32_t;

#define PDTRAIN_INSTANTIATE_KERNELS(R)                                                             \
  template void fill_value(const Exec&, R*, Index, R);                                             \
  template void fill_zero(const Exec&, R*, Index);                                                 \
  template void encoder_forward(const Exec&, R*, const I32*, const R*, const R*, int, int, int,    \
                                int, int);                                                         \
  template void encoder_backward(const Exec&, R*, R*, const R*, const I32*, int, int, int, int,    \
                                 int);                                                             \
  template void layernorm_forward(const Exec&, R*, R*, R*, const R*, const R*, const R*, int,      \
                                  int);                                                            \
  template void layernorm_backward(const Exec&, R*, R*, R*, const R*, const R*, const R*,          \
                                   const R*, const R*, int, int);                                  \
  template void matmul_forward(const Exec&, R*, const R*, const R*, const R*, int, int, int);      \
  template void matmul_backward(const Exec&, R*, R*, R*, const R*, const R*, const R*, int, int,   \
                                int);                                                              \
  template void column_sums_add(const Exec&, R*, const R*, int, int);                               \
  template void bias_add_forward(const Exec&, R*, const R*, int, int);                              \
  template void attention_forward(const Exec&, R*, R*, R*, const R*, int, int, int, int);          \
  template void attention_backward(const Exec&, R*, R*, R*, const R*, const R*, const R*, int,     \
                                   int, int, int);                                                 \
  template void gelu_forward(const Exec&, R*, const R*, Index);                                    \
  template void gelu_backward(const Exec&, R*, const R*, const R*, Index);                         \
  template void residual_forward(const Exec&, R*, const R*, const R*, Index);                      \
  template void add_inplace(const Exec&, R*, const R*, Index);                                     \
  template void softmax_crossentropy_forward(const Exec&, R*, R*, const R*, const I32*, int, int); \
  template void softmax_crossentropy_backward(const Exec&, R*, const R*, const I32*, const R*,     \
                                              int, int, int);                                      \
  template void crossentropy_rowmax(const Exec&, R*, const R*, int, int);                          \
  template void crossentropy_partials(const Exec&, R*, R*, const R*, const R*, const I32*, int,    \
                                      int, int);                                                   \
  template void crossentropy_finish(const Exec&, R*, R*, const R*, int, int);

PDTRAIN_INSTANTIATE_KERNELS(float)
PDTRAIN_INSTANTIATE_KERNELS(double)

#undef PDTRAIN_INSTANTIATE_KERNELS

}  // namespace pdtrain::kernels
