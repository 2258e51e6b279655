#pragma once
// A CPU device whose device memory is not the host's (is_host() false): Mirrored buffers get a
// separate host view, so code that forgets an upload or a download reads stale values. Copies
// are immediate and events no-ops; it checks data movement, not asynchrony.
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>

#include "pdtrain/device/device.hpp"

namespace pdtrain::test {

class SeparateHostDevice final : public Device {
 public:
  std::string describe() const override { return "cpu with separate host memory (test)"; }
  bool is_host() const override { return false; }
  void copy(void* dst, const void* src, std::size_t bytes, Queue = Queue::compute) override {
    std::memcpy(dst, src, bytes);
  }
  void zero(void* dst, std::size_t bytes) override { std::memset(dst, 0, bytes); }
  void synchronize() override {}
  std::unique_ptr<Event> make_event() override { return std::make_unique<NoEvent>(); }
  void record(Event&, Queue) override {}
  void wait(Queue, const Event&) override {}
  void wait_host(const Event&) override {}

 protected:
  void* do_allocate(std::size_t bytes, MemoryKind) override {
    void* p = std::calloc(bytes > 0 ? bytes : 1, 1);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  void do_release(void* p, MemoryKind) noexcept override { std::free(p); }

 private:
  struct NoEvent final : Event {};
};

}  // namespace pdtrain::test
