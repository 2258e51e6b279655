#pragma once
// Backend tests written once, run per backend: test_kernel_ops.cpp and test_device_backend.cpp
// are compiled into test_backend with the CPU backend (cpu_test_backends.cpp) and into
// test_backend_cuda with the CUDA backend (cuda/cuda_test_main.cpp), each of which defines
// test_backends(). Data moves through the backend's own Device: Buffers, copies, synchronize.
#include <gtest/gtest.h>

#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "pdtrain/core/bf16.hpp"
#include "pdtrain/core/rng.hpp"
#include "pdtrain/device/device.hpp"
#include "pdtrain/kernels/backend_registry.hpp"
#include "pdtrain/kernels/kernel_ops.hpp"

namespace pdtrain::kernels::testing {

struct TestBackend {
  std::string name;
  ComputeBackend (*make)();
};
inline std::ostream& operator<<(std::ostream& os, const TestBackend& b) { return os << b.name; }

// The backends this test executable runs the backend tests on.
std::vector<TestBackend> test_backends();
// Backends that differ from one of test_backends() only in their attention family (e.g. a GPU
// with cuDNN's attention): the attention tests run on them too.
std::vector<TestBackend> attention_backends();

// The fixture of a test run once per backend: a fresh backend (its Device and KernelOps) for
// each test. exact(): the backend is the CPU's, whose results must equal the CPU reference's
// bit for bit. A test file derives its fixture and instantiates it with
//   INSTANTIATE_TEST_SUITE_P(Backends, Fixture, ::testing::ValuesIn(test_backends()),
//                            backend_name);
class BackendTest : public ::testing::TestWithParam<TestBackend> {
 protected:
  void SetUp() override { backend_ = GetParam().make(); }
  Device& device() { return *backend_.device; }
  KernelOps& ops() { return *backend_.ops; }
  bool exact() { return device().is_host(); }

 private:
  ComputeBackend backend_;
};

// A backend test instance's name: its backend's ("cpu", "cuda").
inline std::string backend_name(const ::testing::TestParamInfo<TestBackend>& info) {
  return info.param.name;
}

inline Kokkos::DefaultHostExecutionSpace host() { return {}; }

// Normal random floats (counter RNG: the same values on every backend and run).
inline std::vector<float> randn(std::size_t n, std::uint64_t seed, double scale = 1.0,
                                double offset = 0.0) {
  std::vector<float> v(n);
  const std::uint64_t key = rng_key(0x6f70735f74657374ull, seed);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<float>(offset + scale * rng_normal(key, i));
  return v;
}

inline std::vector<std::int32_t> random_tokens(std::size_t n, int below, std::uint64_t seed) {
  std::vector<std::int32_t> t(n);
  const std::uint64_t key = rng_key(0x746f6b5f74657374ull, seed);
  for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<std::int32_t>(rng_below(key, i, below));
  return t;
}

inline std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }
inline std::vector<double> widen(const std::vector<bf16>& v) {
  std::vector<double> d(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) d[i] = to_float(v[i]);
  return d;
}
inline std::vector<bf16> rounded(const std::vector<float>& v) {
  std::vector<bf16> h(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) h[i] = to_bf16(v[i]);
  return h;
}
inline std::vector<float> to_floats(const std::vector<bf16>& v) {
  std::vector<float> f(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) f[i] = to_float(v[i]);
  return f;
}
inline std::vector<double> absolute(std::vector<double> v) {
  for (double& x : v) x = std::abs(x);
  return v;
}

// Host data into a new device buffer of `device`, and back (the host waits for the queue).
template <class T>
Buffer<T> to_device(Device& device, const std::vector<T>& h) {
  Buffer<T> b(device, static_cast<std::int64_t>(h.size()));
  device.copy(b.data(), h.data(), b.bytes());
  device.synchronize();  // h may be a temporary
  return b;
}
template <class T>
std::vector<T> to_host(Device& device, const T* p, std::size_t n) {
  std::vector<T> h(n);
  device.synchronize();
  device.copy(h.data(), p, n * sizeof(T));
  device.synchronize();
  return h;
}
template <class T>
std::vector<T> to_host(Device& device, const Buffer<T>& b) {
  return to_host(device, b.data(), static_cast<std::size_t>(b.size()));
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// |actual - expected| <= bound[i] elementwise; reports the first few failures.
inline void expect_within(const std::string& what, const std::vector<float>& actual,
                          const std::vector<double>& expected, const std::vector<double>& bound) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  ASSERT_EQ(bound.size(), expected.size()) << what;
  int failures = 0;
  for (std::size_t i = 0; i < actual.size(); ++i)
    if (!(std::abs(actual[i] - expected[i]) <= bound[i]) && ++failures <= 5)
      ADD_FAILURE() << what << "[" << i << "]: " << actual[i] << " vs expected " << expected[i]
                    << " (error " << std::abs(actual[i] - expected[i]) << ", bound " << bound[i]
                    << ")";
  EXPECT_EQ(failures, 0) << what << ": " << failures << " elements out of bounds";
}

// |actual - expected| <= tol * max(floor, |expected|).
inline void expect_close(const std::string& what, const std::vector<float>& actual,
                         const std::vector<double>& expected, double tol, double floor = 1.0) {
  std::vector<double> bound(expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i)
    bound[i] = tol * std::max(floor, std::abs(expected[i]));
  expect_within(what, actual, expected, bound);
}

// Bounds for sums of k terms in fp32, in any order and with or without FMA: the rounding
// error is at most gamma_k = k u / (1 - k u) times the sum of the terms' magnitudes (u =
// 2^-24); (k + 2) 2^-23 is twice that, with room for an accumulated initial value.
inline std::vector<double> sum_bounds(const std::vector<double>& magnitude, std::int64_t k) {
  std::vector<double> bound(magnitude.size());
  const double per = static_cast<double>(k + 2) * std::ldexp(1.0, -23);
  for (std::size_t i = 0; i < magnitude.size(); ++i) bound[i] = per * magnitude[i];
  return bound;
}

}  // namespace pdtrain::kernels::testing
