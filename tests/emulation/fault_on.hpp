#pragma once
// The emulation tests' way to watch a device fault (tests/emulation/test_*.cpp).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>

// Runs `launch` with 1024 Elems of device memory on device `device` (one of its own, so the
// sticky error stays there) and returns what the emulation printed; the device's sticky error
// is `*error`.
template <class Elem, class Launch>
std::string fault_on(int device, Launch launch, cudaError_t* error) {
  EXPECT_EQ(cudaSetDevice(device), cudaSuccess);
  Elem* out = nullptr;
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&out), 1024 * sizeof(Elem)), cudaSuccess);
  testing::internal::CaptureStderr();
  launch(out);
  *error = cudaDeviceSynchronize();
  std::string printed = testing::internal::GetCapturedStderr();
  EXPECT_EQ(cudaGetLastError(), *error) << "a fault is sticky";
  cudaSetDevice(0);
  return printed;
}
