#include "pdtrain/kernels/kernel_profile.hpp"

#include <Kokkos_Core.hpp>

#include <chrono>
#include <stdexcept>
#include <utility>
#include <vector>

namespace pdtrain::kernels {

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The callbacks are plain functions: the profile's state is the process's.
struct State {
  bool installed = false, recording = false;
  std::map<std::string, KernelProfile::Entry> total;
  std::map<std::uint64_t, std::pair<std::string, double>> open_kernels;
  std::vector<std::pair<std::string, double>> regions;
  std::uint64_t next_id = 0;
};
State& state() {
  static State s;
  return s;
}

void add(const std::string& name, double seconds) {
  if (!state().recording) return;
  auto& e = state().total[name];
  e.seconds += seconds;
  e.calls += 1;
}

void begin_kernel(const char* name, std::uint32_t, std::uint64_t* id) {
  *id = state().next_id++;
  state().open_kernels[*id] = {name, now()};
}
void end_kernel(std::uint64_t id) {
  auto it = state().open_kernels.find(id);
  if (it == state().open_kernels.end()) return;
  add(it->second.first, now() - it->second.second);
  state().open_kernels.erase(it);
}
void push_region(const char* name) { state().regions.emplace_back(name, now()); }
void pop_region() {
  if (state().regions.empty()) return;
  const auto [name, t0] = state().regions.back();
  state().regions.pop_back();
  add(name, now() - t0);
}

void set_callbacks(bool on) {
  namespace kt = Kokkos::Tools::Experimental;
  kt::set_begin_parallel_for_callback(on ? begin_kernel : nullptr);
  kt::set_end_parallel_for_callback(on ? end_kernel : nullptr);
  kt::set_begin_parallel_reduce_callback(on ? begin_kernel : nullptr);
  kt::set_end_parallel_reduce_callback(on ? end_kernel : nullptr);
  kt::set_begin_parallel_scan_callback(on ? begin_kernel : nullptr);
  kt::set_end_parallel_scan_callback(on ? end_kernel : nullptr);
  kt::set_push_region_callback(on ? push_region : nullptr);
  kt::set_pop_region_callback(on ? pop_region : nullptr);
}

}  // namespace

KernelProfile::KernelProfile() {
  if (state().installed) throw std::logic_error("one kernel profile at a time");
  state() = State{};
  state().installed = true;
  set_callbacks(true);
}

KernelProfile::~KernelProfile() {
  set_callbacks(false);
  state() = State{};
}

void KernelProfile::record(bool on) { state().recording = on; }

std::map<std::string, KernelProfile::Entry> KernelProfile::take() {
  return std::exchange(state().total, {});
}

double KernelProfile::gemm_seconds() const {
  double s = 0;
  for (const auto& [name, e] : state().total)
    if (name.rfind("pdtrain::gemm_", 0) == 0) s += e.seconds;
  return s;
}

}  // namespace pdtrain::kernels
