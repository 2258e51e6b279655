// The fused causal attention kernels (src/kernels/cuda/flash_attention.cu) on GPU 0 against the
// CPU reference (gpt_kernels.hpp attention_forward/backward, in double): out, the saved
// log-sum-exp, and dq, dk, dv accumulated into a non-zero dqkv; both variants (bf16 tiles on
// tensor cores, fp32 tiles on the CUDA cores); the same bits run to run. Shapes: T not a
// multiple of any tile (the masked tails) or shorter than one, head sizes 8 (padded to 16), 16,
// 24 (padded to 32), 40 (padded to 48) and 64 (GPT-2's), B = 1 or 2, NH = 2 or 3. Small: on
// the emulated target every kernel runs twice in the race check.
//
// Tolerances, |got - ref| <= tol * max(1, |ref|) as the other attention tests (each check
// prints its largest error in these units):
//  * fp32 variant: 2e-5 against the reference on the same inputs. The kernels compute in fp32
//    what the reference computes in double; the online softmax rescales the output once per
//    key tile and the backward recomputes the probabilities from the saved log-sum-exp, so
//    errors are a few fp32 ulps of O(1) values times the reduction lengths (<= 70 keys, <= 64
//    channels): measured at most 2.5e-6.
//  * bf16 variant, against the reference on the inputs as its tiles hold them (q, k, v, dout
//    rounded to bf16), so what remains is the rounding of the probabilities P (forward and
//    backward) and of the score gradients dS to bf16 (relative 2^-9 = 2e-3 each) before their
//    products: out and lse 1e-2 (measured at most 2.9e-3 for out; lse 2e-7: the scores are
//    exact products of bf16 values); dq, dk, dv 4e-2 (measured at most 2.0e-2: sums over up to
//    70 terms of dS q, dS k and P^T dout whose rounding errors do not cancel as the terms do).
//    The fp32 variant's bound is 1000 times tighter, so a run whose precision is fp32 that got
//    bf16 attention fails it.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "../../../src/kernels/cuda/flash_attention.hpp"
#include "../backend_test_support.hpp"
#include "pdtrain/kernels/gpt_kernels.hpp"

namespace pdtrain::kernels::testing {
namespace {

using Vec = std::vector<double>;
namespace fa = pdtrain::kernels::cuda;

struct AttnShape {
  int B, T, NH, HS;
  int C() const { return NH * HS; }
  std::size_t qkv() const { return std::size_t(B) * T * 3 * C(); }
  std::size_t out() const { return std::size_t(B) * T * C(); }
  std::size_t rows() const { return std::size_t(B) * NH * T; }
  std::size_t att() const { return rows() * T; }
};

std::string name(const AttnShape& s, bool bf16) {
  return std::string(bf16 ? "bf16" : "fp32") + " B" + std::to_string(s.B) + " T" +
         std::to_string(s.T) + " NH" + std::to_string(s.NH) + " HS" + std::to_string(s.HS);
}

// A device array of T (float or bf16; cudaMalloc), filled from the host, read back after the
// device finished.
template <class T = float>
class DeviceArray {
 public:
  explicit DeviceArray(const std::vector<T>& h) : n_(h.size()) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p_), n_ * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p_, h.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  explicit DeviceArray(std::size_t n) : DeviceArray(std::vector<T>(n, T(7.0f))) {}
  ~DeviceArray() { cudaFree(p_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() const { return p_; }
  std::vector<T> host() const {
    std::vector<T> h(n_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }

 private:
  T* p_ = nullptr;
  std::size_t n_;
};

struct Inputs {
  std::vector<float> qkv, dout, dqkv0;
};

Inputs inputs(const AttnShape& s) {
  // q scaled by 2: scores of a few units, so the softmax is far from uniform.
  std::vector<float> qkv = randn(s.qkv(), 50);
  for (std::size_t i = 0; i < qkv.size(); ++i)
    if (i % (3 * std::size_t(s.C())) < std::size_t(s.C())) qkv[i] *= 2.0f;
  return {qkv, randn(s.out(), 51), randn(s.qkv(), 52)};
}

struct Results {
  std::vector<float> out, lse, dqkv;
};

// The forward, then the backward into dqkv0, on the default stream of GPU 0.
Results run(const AttnShape& s, const Inputs& in, bool bf16) {
  const DeviceArray qkv(in.qkv), dout(in.dout), dqkv(in.dqkv0);
  const DeviceArray out(s.out()), lse(fa::flash_attention_saved_floats(s.B, s.T, s.NH)),
      scratch(fa::flash_attention_scratch_floats(s.B, s.T, s.NH));
  fa::flash_attention_forward(nullptr, out.get(), lse.get(), qkv.get(), s.B, s.T, s.C(), s.NH,
                              bf16);
  fa::flash_attention_backward(nullptr, dqkv.get(), scratch.get(), dout.get(), qkv.get(),
                               out.get(), lse.get(), s.B, s.T, s.C(), s.NH, bf16);
  return {out.host(), lse.host(), dqkv.host()};
}

struct Reference {
  Vec out, lse, dqkv;
};

// gpt_kernels.hpp's attention in double; lse from its scaled scores.
Reference reference(const AttnShape& s, const Inputs& in) {
  const Vec qkv = widen(in.qkv), dout = widen(in.dout);
  Vec out(s.out()), preatt(s.att()), att(s.att()), dpreatt(s.att()), datt(s.att());
  attention_forward(host(), out.data(), preatt.data(), att.data(), qkv.data(), s.B, s.T, s.C(),
                    s.NH);
  Vec dqkv = widen(in.dqkv0);
  attention_backward(host(), dqkv.data(), dpreatt.data(), datt.data(), dout.data(), qkv.data(),
                     att.data(), s.B, s.T, s.C(), s.NH);
  host().fence();
  Vec lse(s.rows());
  for (std::size_t row = 0; row < s.rows(); ++row) {
    const std::size_t t = row % std::size_t(s.T);
    const double* pre = preatt.data() + row * std::size_t(s.T);
    double m = pre[0], sum = 0.0;
    for (std::size_t t2 = 0; t2 <= t; ++t2) m = std::max(m, pre[t2]);
    for (std::size_t t2 = 0; t2 <= t; ++t2) sum += std::exp(pre[t2] - m);
    lse[row] = m + std::log(sum);
  }
  return {out, lse, dqkv};
}

// The part (0 q, 1 k, 2 v) of a [B,T,3C] array.
template <class T>
std::vector<T> part(const std::vector<T>& qkv, const AttnShape& s, int which) {
  std::vector<T> p;
  const std::size_t C = std::size_t(s.C());
  for (std::size_t row = 0; row < std::size_t(s.B) * s.T; ++row)
    for (std::size_t c = 0; c < C; ++c) p.push_back(qkv[row * 3 * C + std::size_t(which) * C + c]);
  return p;
}

constexpr double kTolFp32 = 2e-5, kTolBf16Forward = 1e-2, kTolBf16Backward = 4e-2;

const AttnShape kShapes[] = {
    {2, 37, 2, 8},   // HS padded to 16; T past a 32-row tile (fp32), within one of 64 (bf16)
    {2, 70, 3, 16},  // T past two 32-key tiles and past a 64-query tile
    {2, 21, 2, 24},  // HS padded to 32; one partial tile of everything
    {2, 40, 2, 64},  // GPT-2's head size
    {2, 5, 3, 16},   // T shorter than one WMMA tile
    {1, 45, 2, 40},  // HS padded to 48 (the one padded head size left)
    {1, 19, 2, 10},  // head 1's fp32 rows not 16-byte aligned (the tiles' element loads)
};

// The inputs as the bf16 variant's tiles hold them: q, k, v and dout rounded to bf16 (dqkv0 is
// accumulated onto in fp32).
Inputs as_bf16_tiles(const Inputs& in) {
  return {to_floats(rounded(in.qkv)), to_floats(rounded(in.dout)), in.dqkv0};
}

// expect_close, and the largest error relative to max(1, |ref|) printed (the figure the
// tolerances above are set against).
void expect_close_reporting(const std::string& what, const std::vector<float>& got,
                            const Vec& ref, double tol) {
  double worst = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, std::abs(got[i] - ref[i]) / std::max(1.0, std::abs(ref[i])));
  std::printf("  %-40s max error / max(1, |ref|) = %.3g (tolerance %.0e)\n", what.c_str(), worst,
              tol);
  expect_close(what, got, ref, tol);
}

void check(const AttnShape& s, bool bf16) {
  const Inputs in = inputs(s);
  const Results got = run(s, in, bf16);
  const Reference ref = reference(s, bf16 ? as_bf16_tiles(in) : in);
  const std::string what = name(s, bf16) + ": ";
  const double tol_forward = bf16 ? kTolBf16Forward : kTolFp32;
  const double tol_backward = bf16 ? kTolBf16Backward : kTolFp32;
  expect_close_reporting(what + "out", got.out, ref.out, tol_forward);
  expect_close_reporting(what + "lse", got.lse, ref.lse, tol_forward);
  const char* parts[] = {"dq (+= onto dqkv)", "dk (+= onto dqkv)", "dv (+= onto dqkv)"};
  for (int p = 0; p < 3; ++p)
    expect_close_reporting(what + parts[p], part(got.dqkv, s, p), part(ref.dqkv, s, p),
                           tol_backward);

  const Results again = run(s, in, bf16);
  EXPECT_TRUE(same_bits(got.out, again.out)) << what << "out differs run to run";
  EXPECT_TRUE(same_bits(got.lse, again.lse)) << what << "lse differs run to run";
  EXPECT_TRUE(same_bits(got.dqkv, again.dqkv)) << what << "dqkv differs run to run";
}

TEST(FlashAttention, Fp32TilesMatchTheCpuReferenceAndRepeatBitForBit) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  for (const AttnShape& s : kShapes) check(s, false);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST(FlashAttention, Bf16TensorCoreTilesMatchTheCpuReferenceAndRepeatBitForBit) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  for (const AttnShape& s : kShapes) check(s, true);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// bf16 activations: the overloads taking bf16 qkv and out run the bf16 tiles on the values they
// hold, so they give exactly what the bf16 variant gives on fp32 qkv holding those values: out
// its out rounded once, lse the same bits, and dqkv the same bits when its backward is given the
// bf16 out (D = rowsum(dout * out) from the same values); with bf16_inputs set or not (a bf16
// run's activations always get the bf16 tiles: the two runs must also repeat the same bits).
void check_bf16_activations(const AttnShape& s) {
  {
    const Inputs in = inputs(s);
    const std::vector<bf16> qkv_h = rounded(in.qkv);
    const std::string what = name(s, true) + " activations: ";

    Results io[2];  // bf16 activations, bf16_inputs false and true
    for (const bool bf16_inputs : {false, true}) {
      const DeviceArray<bf16> qkv(qkv_h), out(rounded(std::vector<float>(s.out(), 7.0f)));
      const DeviceArray<> dout(in.dout), dqkv(in.dqkv0),
          lse(fa::flash_attention_saved_floats(s.B, s.T, s.NH)),
          scratch(fa::flash_attention_scratch_floats(s.B, s.T, s.NH));
      fa::flash_attention_forward(nullptr, out.get(), lse.get(), qkv.get(), s.B, s.T, s.C(), s.NH,
                                  bf16_inputs);
      fa::flash_attention_backward(nullptr, dqkv.get(), scratch.get(), dout.get(), qkv.get(),
                                   out.get(), lse.get(), s.B, s.T, s.C(), s.NH, bf16_inputs);
      io[bf16_inputs] = {to_floats(out.host()), lse.host(), dqkv.host()};
    }
    EXPECT_TRUE(same_bits(io[0].out, io[1].out)) << what << "out depends on bf16_inputs";
    EXPECT_TRUE(same_bits(io[0].lse, io[1].lse)) << what << "lse depends on bf16_inputs";
    EXPECT_TRUE(same_bits(io[0].dqkv, io[1].dqkv)) << what << "dqkv depends on bf16_inputs";

    // The fp32-I/O bf16 variant on the same values, its backward given the bf16 out.
    const DeviceArray<> qkv(to_floats(qkv_h)), out(s.out()), given_out(io[1].out), dout(in.dout),
        dqkv(in.dqkv0), lse(fa::flash_attention_saved_floats(s.B, s.T, s.NH)),
        scratch(fa::flash_attention_scratch_floats(s.B, s.T, s.NH));
    fa::flash_attention_forward(nullptr, out.get(), lse.get(), qkv.get(), s.B, s.T, s.C(), s.NH,
                                true);
    fa::flash_attention_backward(nullptr, dqkv.get(), scratch.get(), dout.get(), qkv.get(),
                                 given_out.get(), lse.get(), s.B, s.T, s.C(), s.NH, true);
    const std::vector<float> out_f = out.host();
    int unrounded = 0;
    for (std::size_t i = 0; i < out_f.size(); ++i)
      if (to_bf16(out_f[i]).bits != to_bf16(io[1].out[i]).bits && ++unrounded <= 5)
        ADD_FAILURE() << what << "out[" << i << "] = " << io[1].out[i] << " is not " << out_f[i]
                      << " rounded";
    EXPECT_EQ(unrounded, 0) << what;
    EXPECT_TRUE(same_bits(io[1].lse, lse.host())) << what << "lse differs from the fp32 I/O's";
    EXPECT_TRUE(same_bits(io[1].dqkv, dqkv.host())) << what << "dqkv differs from the fp32 I/O's";
  }
}

TEST(FlashAttention, Bf16ActivationsAreTheBf16VariantOnTheirValues) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  for (const AttnShape& s : kShapes) check_bf16_activations(s);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// The bf16 tiles' forward (128-query blocks of 8 warps, 64-key tiles double-buffered) over
// several query and key tiles, T a multiple of neither, B * NH > 1, head sizes 16, 32, 64:
// against the reference, bit for bit run to run, and bf16 activations (16-byte cp.async) the
// same bits as fp32 ones (element loads).
TEST(FlashAttention, Bf16TilesOverSeveralQueryAndKeyTiles) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  const AttnShape shapes[] = {
      {1, 136, 2, 64},  // 2 query tiles (the second of 8 rows), 3 key tiles (the last partial)
      {1, 131, 2, 32},  // a query tile of 3 rows
      {1, 129, 2, 16},  // a query tile of 1 row, a key tile of 1 key
  };
  for (const AttnShape& s : shapes) {
    check(s, true);
    check_bf16_activations(s);
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// The fp32 variant is not the bf16 one: on the same inputs their outputs differ by far more
// than the fp32 tolerance (a run whose precision is fp32 never silently gets bf16 attention).
TEST(FlashAttention, TheFp32VariantIsNotBf16) {
  const AttnShape s{2, 37, 2, 8};
  const Inputs in = inputs(s);
  const Results f32 = run(s, in, false), b16 = run(s, in, true);
  double most = 0.0;
  for (std::size_t i = 0; i < f32.out.size(); ++i)
    most = std::max(most, double(std::abs(f32.out[i] - b16.out[i])));
  EXPECT_GT(most, 100 * kTolFp32);
}

TEST(FlashAttention, HeadSizesUpTo64) {
  EXPECT_TRUE(fa::flash_attention_supported(768, 12));  // GPT-2 124M
  EXPECT_TRUE(fa::flash_attention_supported(16, 2));
  EXPECT_FALSE(fa::flash_attention_supported(1600, 12));  // NH does not divide C
  EXPECT_FALSE(fa::flash_attention_supported(1024, 8));   // HS 128
}

}  // namespace
}  // namespace pdtrain::kernels::testing
