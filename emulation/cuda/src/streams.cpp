// Streams and events. A stream is an in-order queue of work run by a worker thread of its own,
// so two streams really run at the same time and work on one of them that should have waited
// for the other can read data that is not there yet: the missing wait shows as wrong numbers.
// PDTRAIN_CUDA_EMU_DELAY_US=N makes every stream sleep a random 0..N microseconds before each
// piece of work, which makes such a race very likely to show.
//
// Events follow CUDA: cudaEventRecord captures the stream's work so far; cudaStreamWaitEvent
// and cudaEventSynchronize wait for the most recent record at the time of the call (nothing
// when the event was never recorded). The legacy default stream (nullptr) synchronizes with
// the device's blocking streams as CUDA's does; streams created cudaStreamNonBlocking never do.
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "emulator.hpp"

namespace cuda_emu {
namespace {

// A point in a stream's work that others wait for: `reached` counts the records it has run.
struct Marker {
  std::mutex mu;
  std::condition_variable cv;
  std::uint64_t recorded = 0, reached = 0;

  void reach(std::uint64_t generation) {
    {
      std::lock_guard lock(mu);
      if (generation > reached) reached = generation;
    }
    cv.notify_all();
  }
  void wait_for(std::uint64_t generation) {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return reached >= generation; });
  }
};

struct Work {
  std::string what;
  std::function<void()> run;
  bool bookkeeping = false;  // event records and waits: run even after a fault (no hangs)
};

int delay_us() {
  static const int us = [] {
    const char* v = std::getenv("PDTRAIN_CUDA_EMU_DELAY_US");
    return v != nullptr ? std::atoi(v) : 0;
  }();
  return us;
}

}  // namespace
}  // namespace cuda_emu

struct CUstream_st {
  int device = 0;
  bool blocking = true;  // synchronizes with the legacy default stream
  bool legacy = false;

  std::mutex mu;
  std::condition_variable cv;
  std::deque<cuda_emu::Work> queue;
  std::uint64_t queued = 0, done = 0;
  bool stopping = false;
  std::thread worker;
  std::minstd_rand delays;

  CUstream_st(int dev, bool is_blocking, bool is_legacy, unsigned seed)
      : device(dev), blocking(is_blocking), legacy(is_legacy), delays(seed) {
    worker = std::thread([this] { run(); });
  }
  ~CUstream_st() {
    {
      std::lock_guard lock(mu);
      stopping = true;
    }
    cv.notify_all();
    worker.join();
  }

  void push(cuda_emu::Work w) {
    {
      std::lock_guard lock(mu);
      queue.push_back(std::move(w));
      ++queued;
    }
    cv.notify_all();
  }

  // The host waits for everything queued so far.
  void drain() {
    std::unique_lock lock(mu);
    const std::uint64_t target = queued;
    cv.wait(lock, [&] { return done >= target; });
  }

  bool idle() {
    std::lock_guard lock(mu);
    return done == queued;
  }

 private:
  void run() {
    (void)cudaSetDevice(device);  // the worker's current device: what its work runs on
    for (;;) {
      cuda_emu::Work w;
      {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return stopping || !queue.empty(); });
        if (queue.empty()) return;  // stopping, and everything ran
        w = std::move(queue.front());
        queue.pop_front();
      }
      execute(w);
      {
        std::lock_guard lock(mu);
        ++done;
      }
      cv.notify_all();
    }
  }

  void execute(cuda_emu::Work& w) {
    if (!w.bookkeeping) {
      if (const int us = cuda_emu::delay_us(); us > 0)
        std::this_thread::sleep_for(std::chrono::microseconds(delays() % (us + 1)));
      if (cuda_emu::sticky_error(device) != cudaSuccess) return;  // a faulted device runs nothing
    }
    try {
      w.run();
    } catch (const std::exception& e) {
      cuda_emu::fault(device, cudaErrorLaunchFailure, w.what + ": " + e.what());
    }
  }
};

struct CUevent_st {
  int device = 0;
  std::shared_ptr<cuda_emu::Marker> marker = std::make_shared<cuda_emu::Marker>();
};

namespace cuda_emu {
namespace {

// Every live stream and event, so that a destroyed or made-up handle is refused as CUDA
// refuses it, and so that cudaDeviceSynchronize finds the device's streams.
struct Registry {
  std::mutex mu;
  std::set<CUstream_st*> streams;
  std::set<CUevent_st*> events;
  std::vector<CUstream_st*> legacy = std::vector<CUstream_st*>(64, nullptr);
  unsigned seeds = 0;
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: the legacy streams outlive main()
  return *r;
}

CUstream_st* legacy_stream(int device) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  CUstream_st*& s = r.legacy.at(static_cast<std::size_t>(device));
  if (s == nullptr) {
    s = new CUstream_st(device, true, true, 0x5eed + r.seeds++);
    r.streams.insert(s);
  }
  return s;
}

bool live(CUstream_st* s) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  return r.streams.count(s) != 0;
}

bool live(CUevent_st* e) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  return r.events.count(e) != 0;
}

// nullptr: the current device's legacy stream; a destroyed or unknown handle: nullptr.
CUstream_st* resolve(cudaStream_t stream) {
  if (stream == nullptr) return legacy_stream(current_device());
  return live(stream) ? stream : nullptr;
}

// `to` waits (on the device) for everything queued on `from` so far.
void order_after(CUstream_st* to, CUstream_st* from) {
  auto marker = std::make_shared<Marker>();
  marker->recorded = 1;
  from->push({"implicit synchronization", [marker] { marker->reach(1); }, true});
  to->push({"implicit synchronization", [marker] { marker->wait_for(1); }, true});
}

// The legacy stream's implicit synchronization: work on it waits for the device's blocking
// streams, and work on a blocking stream waits for the legacy stream.
void synchronize_with_legacy(CUstream_st* s) {
  if (!s->blocking) return;
  if (!s->legacy) {
    order_after(s, legacy_stream(s->device));
    return;
  }
  std::vector<CUstream_st*> others;
  {
    Registry& r = registry();
    std::lock_guard lock(r.mu);
    for (CUstream_st* o : r.streams)
      if (o != s && o->device == s->device && o->blocking && !o->idle()) others.push_back(o);
  }
  for (CUstream_st* o : others) order_after(s, o);
}

}  // namespace

int device_of(cudaStream_t stream) {
  if (stream == nullptr) return current_device();
  return live(stream) ? stream->device : current_device();
}

cudaError_t enqueue(cudaStream_t stream, std::string what, std::function<void()> work) {
  CUstream_st* s = resolve(stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (const cudaError_t e = sticky_error(s->device)) return e;
  synchronize_with_legacy(s);
  s->push({std::move(what), std::move(work), false});
  return cudaSuccess;
}

cudaError_t synchronize(cudaStream_t stream) {
  CUstream_st* s = resolve(stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  s->drain();
  return sticky_error(s->device);
}

}  // namespace cuda_emu

using namespace cuda_emu;

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
  if (stream == nullptr || (flags & ~cudaStreamNonBlocking) != 0)
    return fail(cudaErrorInvalidValue);
  if (visible_device_count() == 0) return fail(cudaErrorNoDevice);
  if (const cudaError_t e = sticky_error(current_device())) return e;
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  *stream = new CUstream_st(current_device(), (flags & cudaStreamNonBlocking) == 0, false,
                            0x5eed + r.seeds++);
  r.streams.insert(*stream);
  return cudaSuccess;
}

// CUDA returns at once and releases the stream when its work is done; here the host waits for
// that work first (the same outcome for a correct program).
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (stream == nullptr || !live(stream) || stream->legacy)
    return fail(cudaErrorInvalidResourceHandle);
  {
    Registry& r = registry();
    std::lock_guard lock(r.mu);
    r.streams.erase(stream);
  }
  delete stream;  // runs what is queued, then joins the worker
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) { return synchronize(stream); }

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  CUstream_st* s = resolve(stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (const cudaError_t e = sticky_error(s->device)) return e;
  return s->idle() ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags) {
  CUstream_st* s = resolve(stream);
  if (s == nullptr || event == nullptr || !live(event)) return fail(cudaErrorInvalidResourceHandle);
  if (flags != 0) return fail(cudaErrorInvalidValue);
  if (const cudaError_t e = sticky_error(s->device)) return e;
  std::shared_ptr<Marker> marker = event->marker;
  std::uint64_t target = 0;
  {
    std::lock_guard lock(marker->mu);
    target = marker->recorded;
  }
  if (target == 0) return cudaSuccess;  // never recorded: nothing to wait for
  s->push({"cudaStreamWaitEvent", [marker, target] { marker->wait_for(target); }, true});
  return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* user_data) {
  if (fn == nullptr) return fail(cudaErrorInvalidValue);
  return enqueue(stream, "cudaLaunchHostFunc", [fn, user_data] { fn(user_data); });
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags) {
  if (event == nullptr || (flags & ~(cudaEventBlockingSync | cudaEventDisableTiming)) != 0)
    return fail(cudaErrorInvalidValue);
  if (visible_device_count() == 0) return fail(cudaErrorNoDevice);
  *event = new CUevent_st;
  (*event)->device = current_device();
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  r.events.insert(*event);
  return cudaSuccess;
}

// Waits queued on the event hold its marker: destroying it does not disturb them (CUDA: "the
// resources are released once the event has completed").
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (event == nullptr || !live(event)) return fail(cudaErrorInvalidResourceHandle);
  {
    Registry& r = registry();
    std::lock_guard lock(r.mu);
    r.events.erase(event);
  }
  delete event;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  CUstream_st* s = resolve(stream);
  if (s == nullptr || event == nullptr || !live(event)) return fail(cudaErrorInvalidResourceHandle);
  if (const cudaError_t e = sticky_error(s->device)) return e;
  std::shared_ptr<Marker> marker = event->marker;
  std::uint64_t generation = 0;
  {
    std::lock_guard lock(marker->mu);
    generation = ++marker->recorded;
  }
  synchronize_with_legacy(s);
  s->push({"cudaEventRecord", [marker, generation] { marker->reach(generation); }, true});
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (event == nullptr || !live(event)) return fail(cudaErrorInvalidResourceHandle);
  std::shared_ptr<Marker> marker = event->marker;
  std::uint64_t target = 0;
  {
    std::lock_guard lock(marker->mu);
    target = marker->recorded;
  }
  marker->wait_for(target);
  return sticky_error(event->device);
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (event == nullptr || !live(event)) return fail(cudaErrorInvalidResourceHandle);
  if (const cudaError_t e = sticky_error(event->device)) return e;
  std::lock_guard lock(event->marker->mu);
  return event->marker->reached >= event->marker->recorded ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaDeviceSynchronize() { return synchronize_device(current_device()); }

cudaError_t cuda_emu::synchronize_device(int device) {
  std::vector<CUstream_st*> streams;
  {
    Registry& r = registry();
    std::lock_guard lock(r.mu);
    for (CUstream_st* s : r.streams)
      if (s->device == device) streams.push_back(s);
  }
  for (CUstream_st* s : streams) s->drain();
  return sticky_error(device);
}
