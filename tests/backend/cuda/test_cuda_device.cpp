// The CUDA backend's own checks: what the build and the GPU say about themselves, the memory
// kinds as CUDA sees them, and clear errors for a GPU that is not there or memory that is not.
#include <cuda_runtime_api.h>

#include "../backend_test_support.hpp"
#include "pdtrain/core/error.hpp"

namespace pdtrain::kernels::testing {
namespace {

TEST(CudaBackend, DescribesBuildDeviceAndLibraries) {
  EXPECT_TRUE(cuda_backend_built());
  EXPECT_GE(cuda_device_count(), 1);
#ifdef PDTRAIN_CUDA_EMULATED
  // An emulated run never passes for a GPU result: it says so wherever a GPU run names its GPU.
  EXPECT_NE(backends_built().find("cuda (emulated on the CPU)"), std::string::npos)
      << backends_built();
  EXPECT_NE(make_backend("cuda", 0).device->describe().find("emulated"), std::string::npos);
#else
  EXPECT_NE(backends_built().find("cuda (sm_"), std::string::npos) << backends_built();
#endif
  const ComputeBackend b = make_backend("cuda", 0);
  EXPECT_FALSE(b.device->is_host());
  EXPECT_EQ(b.device->describe().rfind("cuda:0 ", 0), 0u) << b.device->describe();
  EXPECT_NE(b.device->describe().find(" SMs, "), std::string::npos) << b.device->describe();
  EXPECT_NE(b.ops->describe().find("cuBLASLt"), std::string::npos) << b.ops->describe();
  EXPECT_NE(b.ops->describe().find("without TF32"), std::string::npos) << b.ops->describe();
}

TEST(CudaBackend, AGpuThatIsNotVisibleIsAClearError) {
  try {
    make_backend("cuda", cuda_device_count());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::runtime);
    EXPECT_NE(std::string(e.what()).find("compute.device = cuda"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("visible"), std::string::npos) << e.what();
  }
}

TEST(CudaDevice, MemoryKindsAreWhatTheySay) {
  ComputeBackend b = make_backend("cuda", 0);
  Buffer<float> host_buf(*b.device, 16, MemoryKind::host),
      pinned(*b.device, 16, MemoryKind::pinned), dev(*b.device, 16, MemoryKind::device);
  const auto type = [](const void* p) {
    cudaPointerAttributes a{};
    EXPECT_EQ(cudaPointerGetAttributes(&a, p), cudaSuccess);
    return a.type;
  };
  EXPECT_EQ(type(dev.data()), cudaMemoryTypeDevice);
  EXPECT_EQ(type(pinned.data()), cudaMemoryTypeHost);
  EXPECT_EQ(type(host_buf.data()), cudaMemoryTypeUnregistered);
}

TEST(CudaDevice, AllocationFailureNamesTheBytesAndFreeMemory) {
  ComputeBackend b = make_backend("cuda", 0);
  const std::int64_t before = b.device->bytes_in_use();
  const std::int64_t huge = std::int64_t{1} << 50;  // 1 PiB
  try {
    Buffer<std::byte> buf(*b.device, huge);
    FAIL() << "1 PiB of GPU memory was allocated";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::runtime);
    EXPECT_NE(std::string(e.what()).find(std::to_string(huge) + " bytes"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("free"), std::string::npos) << e.what();
  }
  EXPECT_EQ(b.device->bytes_in_use(), before);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // the failure left no error behind
  Buffer<float> after(*b.device, 1000);        // and the device still works
  b.device->synchronize();
}

// The same GEMM shape gives the same bits wherever its matrices lie: the replicated baseline
// keeps a weight in its tensor-major arrays, PD in a cache slot, at other alignments beyond 16
// bytes, and PD must equal the baseline bit for bit. (On the emulated target cuBLASLt's
// heuristic offers a wider algorithm, with another summation order, to 128-byte-aligned
// matrices: a plan keyed on the full alignment picks it for one placement and not the other.)
TEST(CudaGemm, TheSameShapeGivesTheSameBitsAtAnyAlignment) {
  ComputeBackend b = make_backend("cuda", 0);
  const int N = 16, C = 64, OC = 64;
  const std::int64_t shift = 16;  // floats: 64 bytes, 16-byte aligned but not 128
  const std::vector<float> inp = randn(std::size_t{N} * C, 1), w = randn(std::size_t{OC} * C, 2);
  Buffer<float> ins(*b.device, N * C + shift), ws(*b.device, OC * C + shift);
  Buffer<float> out_a(*b.device, N * OC), out_b(*b.device, N * OC);
  for (std::int64_t at : {std::int64_t{0}, shift}) {
    b.device->copy(ins.data() + at, inp.data(), inp.size() * sizeof(float));
    b.device->copy(ws.data() + at, w.data(), w.size() * sizeof(float));
    b.device->synchronize();
    b.ops->gemm().matmul_forward(at == 0 ? out_a.data() : out_b.data(), ins.data() + at,
                                 ws.data() + at, nullptr, N, C, OC, OC);
  }
  EXPECT_TRUE(same_bits(to_host(*b.device, out_a), to_host(*b.device, out_b)))
      << "a GEMM's bits depend on where its matrices lie";
}

}  // namespace
}  // namespace pdtrain::kernels::testing
