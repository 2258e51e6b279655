#pragma once
// The small model shape several unit tests share (catalogue, llm.c format, checkpoints). Tests
// that need another shape write it in place: resolve_model_shape({.n_layer = 3, ...}).
#include "pdtrain/model/catalog.hpp"

namespace pdtrain::test {

// L=2, NH=4, C=16, V=50 padded to Vp=128, T=8, maxT=10. maxT does not divide by 4, so wpe's
// blocks are unequal and some chunks straddle two blocks.
inline ModelShape tiny_shape() {
  return resolve_model_shape({.n_layer = 2, .n_head = 4, .d_model = 16, .vocab_size = 50,
                              .seq_len = 8, .max_seq_len = 10});
}

}  // namespace pdtrain::test
