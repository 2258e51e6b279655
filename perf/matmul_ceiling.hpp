#pragma once
// The matmul ceiling of this machine and build: GFLOP/s of kernels::gemm (fp32 or bf16) at the
// GEMM shapes of a GPT-2 layer and LM head, forward (NT) and backward (NN for the input
// gradient, TN for the weight gradient), as the model calls them. A benchmark that reports
// model GFLOP/s divides by this, measured in the same run with the same thread count.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <vector>

#include "pdtrain/kernels/bf16.hpp"
#include "pdtrain/kernels/gemm.hpp"

namespace pdtrain::perf {

struct MatmulShape {
  const char* layer;  // qkv, fc, fcproj, lmhead
  const char* pass;   // fwd (out = in W^T), dinp (din = dout W), dweight (dW = dout^T in)
  bool trans_a, trans_b;
  int M, N, K;
  double flops() const { return 2.0 * M * double(N) * K; }
};

// For `tokens` rows (batch x sequence), width C and vocabulary V; GPT-2 124M by default.
// Each weight W[out, in] gives out = in W^T (M=tokens, N=out, K=in) and its two gradients.
inline std::vector<MatmulShape> gpt2_matmul_shapes(int tokens, int C = 768, int V = 50304) {
  struct Layer {
    const char* name;
    int out, in;
  };
  const Layer layers[] = {
      {"qkv", 3 * C, C}, {"fc", 4 * C, C}, {"fcproj", C, 4 * C}, {"lmhead", V, C}};
  std::vector<MatmulShape> shapes;
  for (const Layer& l : layers) {
    shapes.push_back({l.name, "fwd", false, true, tokens, l.out, l.in});
    shapes.push_back({l.name, "dinp", false, false, tokens, l.in, l.out});
    shapes.push_back({l.name, "dweight", true, false, l.out, l.in, tokens});
  }
  return shapes;
}

// GFLOP/s of one shape: one untimed call (creates the cached primitive), then the best of at
// least 3 timed calls and of as many as fit in min_seconds. beta = 1, as the model accumulates.
inline double matmul_gflops(const MatmulShape& s, bool bf16, double min_seconds) {
  const int a_rows = s.trans_a ? s.K : s.M, a_cols = s.trans_a ? s.M : s.K;
  const int b_rows = s.trans_b ? s.N : s.K, b_cols = s.trans_b ? s.K : s.N;
  std::mt19937 gen(1234);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> a(std::size_t(a_rows) * a_cols), b(std::size_t(b_rows) * b_cols);
  std::vector<float> c(std::size_t(s.M) * s.N, 0.0f);
  for (float& x : a) x = dist(gen);
  for (float& x : b) x = dist(gen);
  std::vector<kernels::bf16> ah(bf16 ? a.size() : 0), bh(bf16 ? b.size() : 0);
  if (bf16) {
    kernels::to_bf16(a.data(), ah.data(), std::int64_t(a.size()));
    kernels::to_bf16(b.data(), bh.data(), std::int64_t(b.size()));
  }
  auto call = [&] {
    if (bf16)
      kernels::gemm(s.trans_a, s.trans_b, s.M, s.N, s.K, 1.0f, ah.data(), a_cols, bh.data(), b_cols,
                    1.0f, c.data(), s.N);
    else
      kernels::gemm(s.trans_a, s.trans_b, s.M, s.N, s.K, 1.0f, a.data(), a_cols, b.data(), b_cols,
                    1.0f, c.data(), s.N);
  };
  using clock = std::chrono::steady_clock;
  call();
  double best = 1e30, total = 0;
  for (int rep = 0; rep < 3 || total < min_seconds; ++rep) {
    const auto t0 = clock::now();
    call();
    const double dt = std::chrono::duration<double>(clock::now() - t0).count();
    best = std::min(best, dt);
    total += dt;
  }
  return s.flops() / best * 1e-9;
}

// The ceiling: the mean GFLOP/s over gpt2_matmul_shapes(tokens); per-shape rates (in the
// order of gpt2_matmul_shapes) into *per_shape when given.
inline double matmul_ceiling_gflops(bool bf16, int tokens = 256, double min_seconds = 0.3,
                                    std::vector<double>* per_shape = nullptr) {
  const auto shapes = gpt2_matmul_shapes(tokens);
  double sum = 0;
  if (per_shape) per_shape->clear();
  for (const MatmulShape& s : shapes) {
    const double g = matmul_gflops(s, bf16, min_seconds);
    sum += g;
    if (per_shape) per_shape->push_back(g);
  }
  return sum / double(shapes.size());
}

}  // namespace pdtrain::perf
