#pragma once
// Tests written once and run on every compute backend (Cabana's pattern): a test in
// tests/backend/ is TEST_P(BackendTest, Name) and uses device() and ops(); each backend's test
// executable instantiates the fixture once (tests/backend/cpu_backend.cpp for the CPU,
// tests/gpu/cuda_backend.cpp for CUDA, whose executable reports "skipped" without a GPU).
#include <gtest/gtest.h>

#include "pdtrain/kernels/kernel_ops.hpp"

namespace pdtrain {

struct BackendFactory {
  const char* name;
  kernels::ComputeBackend (*make)();
};

class BackendTest : public ::testing::TestWithParam<BackendFactory> {
 protected:
  void SetUp() override { backend_ = GetParam().make(); }
  void TearDown() override {
    if (backend_.device) backend_.device->synchronize();
  }
  Device& device() { return *backend_.device; }
  kernels::KernelOps& ops() { return *backend_.ops; }
  bool on_host() { return backend_.device->is_host(); }

 private:
  kernels::ComputeBackend backend_;
};

inline std::string backend_name(const ::testing::TestParamInfo<BackendFactory>& info) {
  return info.param.name;
}

}  // namespace pdtrain
