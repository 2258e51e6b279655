// The backend registry (backend_registry.hpp): the backends this binary has, by name, made by
// their factories; and one family replaced in a backend's KernelOps.
#include <algorithm>

#include "backend_test_support.hpp"
#include "pdtrain/core/error.hpp"

namespace pdtrain::kernels::testing {
namespace {

TEST(BackendRegistry, HasTheCpuFirstAndCudaExactlyWhenBuilt) {
  const std::vector<BackendEntry>& all = backend_registry();
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(all.front().name, "cpu");
  EXPECT_EQ(find_backend("cpu"), &all.front());
  EXPECT_EQ(find_backend("cuda") != nullptr, cuda_backend_built());
  for (const BackendEntry& e : all) {
    EXPECT_NE(e.make, nullptr) << e.name;
    EXPECT_EQ(std::count_if(all.begin(), all.end(),
                            [&](const BackendEntry& o) { return o.name == e.name; }),
              1)
        << e.name << " registered twice";
    EXPECT_NE(backends_built().find(e.description), std::string::npos) << backends_built();
  }
  EXPECT_EQ(backends_built().rfind("cpu", 0), 0u) << backends_built();
}

TEST(BackendRegistry, MakesTheCpuBackendByName) {
  const ComputeBackend b = make_backend("cpu");
  ASSERT_NE(b.device, nullptr);
  EXPECT_TRUE(b.device->is_host());
  EXPECT_EQ(b.owned_device, nullptr);
  ASSERT_NE(b.ops, nullptr);
  EXPECT_EQ(b.ops->describe().rfind("cpu: Kokkos ", 0), 0u) << b.ops->describe();
  EXPECT_TRUE(b.gpu_uuid.empty());
}

TEST(BackendRegistry, AnUnknownNameIsAClearErrorListingTheBackends) {
  try {
    make_backend("tpu");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::runtime);
    EXPECT_NE(std::string(e.what()).find("\"tpu\""), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(backends_built()), std::string::npos) << e.what();
  }
  EXPECT_EQ(find_backend("tpu"), nullptr);
}

// A stand-in attention family: forwards to another and names itself.
class NamedAttention final : public AttentionOps {
 public:
  explicit NamedAttention(AttentionOps& inner) : inner_(inner) {}
  std::string describe() const override { return "stand-in"; }
  Index saved_floats(const AttentionShape& s) const override { return inner_.saved_floats(s); }
  Index scratch_floats(const AttentionShape& s) const override {
    return inner_.scratch_floats(s);
  }
  void forward(float* out, float* saved, float* scratch, const float* qkv,
               const AttentionShape& s) override {
    ++calls;
    inner_.forward(out, saved, scratch, qkv, s);
  }
  void backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                const float* out, const float* saved, const AttentionShape& s) override {
    ++calls;
    inner_.backward(dqkv, scratch, dout, qkv, out, saved, s);
  }
  void forward(bf16* out, float* saved, float* scratch, const bf16* qkv,
               const AttentionShape& s) override {
    ++calls;
    inner_.forward(out, saved, scratch, qkv, s);
  }
  void backward(float* dqkv, float* scratch, const float* dout, const bf16* qkv, const bf16* out,
                const float* saved, const AttentionShape& s) override {
    ++calls;
    inner_.backward(dqkv, scratch, dout, qkv, out, saved, s);
  }
  int calls = 0;

 private:
  AttentionOps& inner_;
};

TEST(KernelOps, ReplacingTheAttentionLeavesTheOtherFamilies) {
  ComputeBackend b = make_backend("cpu");
  GemmOps* gemm = &b.ops->gemm();
  auto named = std::make_unique<NamedAttention>(cpu_kernel_ops().attention());
  NamedAttention* attention = named.get();
  b.ops->replace_attention(std::move(named));
  EXPECT_EQ(&b.ops->attention(), attention);
  EXPECT_EQ(&b.ops->gemm(), gemm);
  EXPECT_NE(b.ops->describe().find("; attention: stand-in"), std::string::npos)
      << b.ops->describe();
  const AttentionShape s{1, 3, 4, 2, false};
  Buffer<float> qkv(*b.device, 3 * 12), out(*b.device, 12);
  Buffer<float> saved(*b.device, b.ops->attention().saved_floats(s)),
      scratch(*b.device, b.ops->attention().scratch_floats(s));
  std::fill_n(qkv.data(), qkv.size(), 0.5f);
  b.ops->attention().forward(out.data(), saved.data(), scratch.data(), qkv.data(), s);
  EXPECT_EQ(attention->calls, 1);
  EXPECT_EQ(out.data()[0], 0.5f);  // the first token attends to itself only: its v
}

}  // namespace
}  // namespace pdtrain::kernels::testing
