#pragma once
// Seconds and calls per kernel, through Kokkos' tool callbacks: the labels of parallel_for,
// parallel_reduce and parallel_scan, and the GEMM regions kernels::gemm opens ("pdtrain::gemm_NT
// MxNxK"). A kernel is timed from its launch to its return, which is its end on the host
// backends (Serial, OpenMP); not for device kernels. One profile at a time per process: it owns
// the callbacks while it lives. Used by perf/bench_single_rank --profile and by
// `pdtrain plan --calibrate` (the elementwise rate: a layer's time less its GEMMs').
#include <cstdint>
#include <map>
#include <string>

namespace pdtrain::kernels {

class KernelProfile {
 public:
  struct Entry {
    double seconds = 0;
    long calls = 0;
  };
  KernelProfile();   // installs the callbacks; not recording yet
  ~KernelProfile();  // removes them
  KernelProfile(const KernelProfile&) = delete;
  KernelProfile& operator=(const KernelProfile&) = delete;

  void record(bool on);
  // Totals per kernel name since the last take (recorded time only), and clears them.
  std::map<std::string, Entry> take();
  // Recorded seconds in GEMMs (regions named "pdtrain::gemm_...") since the last take.
  double gemm_seconds() const;
};

}  // namespace pdtrain::kernels
