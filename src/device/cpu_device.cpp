// The CPU device: host memory for every kind, copies as memcpy, no queues.
#include <cstdlib>
#include <cstring>
#include <new>

#include "pdtrain/core/error.hpp"
#include "pdtrain/device/device.hpp"

namespace pdtrain {
namespace {

class CpuEvent final : public Event {};

class CpuDevice final : public Device {
 public:
  std::string describe() const override { return "cpu"; }
  bool is_host() const override { return true; }

  void copy(void* dst, const void* src, std::size_t bytes, Queue) override {
    if (bytes > 0 && dst != src) std::memmove(dst, src, bytes);
  }
  void zero(void* dst, std::size_t bytes) override { std::memset(dst, 0, bytes); }
  void synchronize() override {}

  std::unique_ptr<Event> make_event() override { return std::make_unique<CpuEvent>(); }
  void record(Event&, Queue) override {}
  void wait(Queue, const Event&) override {}
  void wait_host(const Event&) override {}

 protected:
  void* do_allocate(std::size_t bytes, MemoryKind) override {
    // 64-byte aligned (a cache line, an AVX-512 vector), zero-filled like a std::vector.
    void* p = std::aligned_alloc(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
    if (p == nullptr)
      throw Error(ExitCode::runtime,
                  "cannot allocate " + std::to_string(bytes) + " bytes of host memory");
    std::memset(p, 0, bytes);
    return p;
  }
  void do_release(void* p, MemoryKind) noexcept override { std::free(p); }

 private:
  static constexpr std::size_t kAlign = 64;
};

}  // namespace

Device& cpu_device() {
  static CpuDevice device;
  return device;
}

}  // namespace pdtrain
