// Work counts of an emulated run (PDTRAIN_CUDA_EMU_COUNTS=DIR): every kernel launch, library
// GEMM, copy and memset queued on an emulated GPU, by name, with the FLOPs and bytes the
// emulation can know exactly (a GEMM's from its shape; a copy's and a memset's sizes). A
// kernel's own traffic is not known here (no memory model), so kernels count launches and
// threads only. Counted when queued, which is what a GPU would run: the race check's second
// run is not counted. At exit the process writes DIR/counts.<pid>.tsv, sorted by kind and name:
//   kind  name  calls  threads  flops  bytes
// perf/emulated_counts.sh differences two runs of different step counts for per-step figures.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <unistd.h>

#include "emulator.hpp"

namespace cuda_emu {
namespace {

struct Tally {
  std::uint64_t calls = 0, threads = 0, flops = 0, bytes = 0;
};

class Counters {
 public:
  Counters() {
    if (const char* dir = std::getenv("PDTRAIN_CUDA_EMU_COUNTS"); dir != nullptr && *dir != 0)
      dir_ = dir;
  }
  ~Counters() { write(); }

  bool on() const { return !dir_.empty(); }

  void add(const char* kind, const std::string& name, const Tally& t) {
    std::lock_guard lock(mutex_);
    Tally& s = tallies_[{kind, name}];
    s.calls += t.calls, s.threads += t.threads, s.flops += t.flops, s.bytes += t.bytes;
  }

 private:
  void write() const {
    if (!on()) return;
    const std::string path = dir_ + "/counts." + std::to_string(getpid()) + ".tsv";
    std::FILE* f = std::fopen(path.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "cuda emulation: cannot write the work counts to %s\n", path.c_str());
      return;
    }
    std::fprintf(f, "kind\tname\tcalls\tthreads\tflops\tbytes\n");
    for (const auto& [key, t] : tallies_)
      std::fprintf(f, "%s\t%s\t%llu\t%llu\t%llu\t%llu\n", std::get<0>(key).c_str(),
                   std::get<1>(key).c_str(), static_cast<unsigned long long>(t.calls),
                   static_cast<unsigned long long>(t.threads),
                   static_cast<unsigned long long>(t.flops),
                   static_cast<unsigned long long>(t.bytes));
    std::fclose(f);
  }

  std::string dir_;
  mutable std::mutex mutex_;
  std::map<std::tuple<std::string, std::string>, Tally> tallies_;
};

Counters& counters() {
  static Counters c;  // written by its destructor at exit
  return c;
}

}  // namespace

bool counting() { return counters().on(); }

void count_work(const char* kind, const std::string& name, std::uint64_t threads,
                std::uint64_t flops, std::uint64_t bytes) {
  if (counting()) counters().add(kind, name, {1, threads, flops, bytes});
}

}  // namespace cuda_emu
