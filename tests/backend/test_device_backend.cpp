// The Device seam on each backend (the CPU here, the GPU in test_backend_cuda): zero-filled
// allocations of every memory kind, device bytes counted, copies between every pair of kinds on
// both queues, events ordering the copy queue before compute work, Mirrored's host view.
#include "backend_test_support.hpp"

namespace pdtrain::kernels::testing {
namespace {

class DeviceTest : public BackendTest {};

constexpr MemoryKind kKinds[] = {MemoryKind::host, MemoryKind::pinned, MemoryKind::device};

TEST_P(DeviceTest, AllocationsAreZeroFilledAndDeviceBytesCounted) {
  Device& d = device();
  EXPECT_FALSE(d.describe().empty());
  const std::int64_t before = d.bytes_in_use();
  {
    Buffer<float> host_buf(d, 1001, MemoryKind::host), pinned(d, 1001, MemoryKind::pinned),
        dev(d, 1001, MemoryKind::device), empty(d, 0);
    EXPECT_EQ(d.bytes_in_use(), before + 1001 * 4);  // device memory only
    EXPECT_GE(d.peak_bytes(), d.bytes_in_use());
    EXPECT_TRUE(empty.empty());
    EXPECT_EQ(empty.data(), nullptr);
    for (const Buffer<float>* b : {&host_buf, &pinned, &dev})
      for (const float x : to_host(d, *b)) ASSERT_EQ(x, 0.0f);
    Buffer<float> moved = std::move(dev);
    EXPECT_EQ(d.bytes_in_use(), before + 1001 * 4);  // moving is not allocating
  }
  EXPECT_EQ(d.bytes_in_use(), before);
}

TEST_P(DeviceTest, CopiesBetweenEveryPairOfKindsOnBothQueues) {
  Device& d = device();
  const auto x = randn(4099, 60);
  const std::size_t bytes = x.size() * sizeof(float);
  const auto n = static_cast<std::int64_t>(x.size());
  for (const MemoryKind from : kKinds)
    for (const MemoryKind to : kKinds)
      for (const Queue queue : {Queue::compute, Queue::copy}) {
        Buffer<float> src(d, n, from), dst(d, n, to);
        auto on_compute = d.make_event(), on_copy = d.make_event();
        d.copy(src.data(), x.data(), bytes);  // compute queue
        d.record(*on_compute, Queue::compute);
        d.wait(Queue::copy, *on_compute);  // the copy queue starts after it
        d.copy(dst.data(), src.data(), bytes, queue);
        d.record(*on_copy, queue);
        d.wait(Queue::compute, *on_copy);
        d.zero(dst.data() + 10, 5 * sizeof(float));  // compute queue, after the copy
        auto y = to_host(d, dst);
        for (std::int64_t i = 0; i < n; ++i)
          ASSERT_EQ(y[static_cast<std::size_t>(i)],
                    i >= 10 && i < 15 ? 0.0f : x[static_cast<std::size_t>(i)])
              << static_cast<int>(from) << "->" << static_cast<int>(to) << " on queue "
              << static_cast<int>(queue) << " at " << i;
      }
}

// The copy queue's upload, an event, and a compute-queue kernel that reads the upload: the
// kernel must see the whole upload (on a GPU the copy takes milliseconds and the kernel would
// otherwise run during it).
TEST_P(DeviceTest, EventOrdersAnUploadBeforeTheKernelThatReadsIt) {
  Device& d = device();
  const std::int64_t n = std::int64_t{1} << 23;  // 32 MiB
  Buffer<float> staging(d, n, MemoryKind::pinned), x(d, n), y(d, n);
  for (std::int64_t i = 0; i < n; ++i) staging.data()[i] = static_cast<float>(i % 1000) + 0.5f;
  d.synchronize();  // the allocations' zero fills are done
  d.copy(x.data(), staging.data(), staging.bytes(), Queue::copy);
  auto uploaded = d.make_event();
  d.record(*uploaded, Queue::copy);
  d.wait(Queue::compute, *uploaded);
  ops().elementwise().residual_forward(y.data(), x.data(), x.data(), n);
  auto done = d.make_event();
  d.record(*done, Queue::compute);
  d.wait_host(*done);
  const auto got = to_host(d, y);
  for (std::int64_t i = 0; i < n; ++i)
    ASSERT_EQ(got[static_cast<std::size_t>(i)], 2.0f * (static_cast<float>(i % 1000) + 0.5f)) << i;
}

TEST_P(DeviceTest, MirroredMovesOnlyWhatItIsAskedTo) {
  Device& d = device();
  const std::int64_t n = 1000;
  Mirrored<float> m(d, n);
  EXPECT_EQ(m.size(), n);
  EXPECT_EQ(m.host() == m.device(), d.is_host());  // the CPU makes no copy at all
  for (std::int64_t i = 0; i < n; ++i) m.host()[i] = static_cast<float>(i);
  m.upload(100, 50);  // only elements [100, 150) reach the device
  ops().elementwise().residual_forward(m.device(), m.device(), m.device(), n);
  m.download();
  d.synchronize();
  for (std::int64_t i = 0; i < n; ++i) {
    const float uploaded = d.is_host() || (i >= 100 && i < 150) ? static_cast<float>(i) : 0.0f;
    ASSERT_EQ(m.host()[i], 2.0f * uploaded) << i;
  }
  m.upload();
  ops().elementwise().residual_forward(m.device(), m.device(), m.device(), n);
  m.download();
  d.synchronize();
  for (std::int64_t i = 0; i < n; ++i) {
    const float before = d.is_host() || (i >= 100 && i < 150) ? 2.0f * static_cast<float>(i) : 0.0f;
    ASSERT_EQ(m.host()[i], 2.0f * before) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, DeviceTest, ::testing::ValuesIn(test_backends()),
                         backend_name);

}  // namespace
}  // namespace pdtrain::kernels::testing
