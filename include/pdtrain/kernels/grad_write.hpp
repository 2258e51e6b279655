#pragma once
// How a backward writes an input gradient. accumulate: += (the kernels' convention, llm.c's).
// overwrite: as if the buffer had been zeroed just before, without the clear and without
// reading it (it may hold anything, NaN included). Elementwise kernels compute 0 + x, the bits
// of accumulating onto zeros (signed zeros too); GEMMs run with beta = 0.
namespace pdtrain::kernels {

enum class GradWrite { accumulate, overwrite };

}  // namespace pdtrain::kernels
