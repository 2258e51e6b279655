#pragma once
// Wall-clock phase timers: one PhaseTimers per rank accumulates seconds per named phase
// (fetch, forward, backward, reduce, push, update, ...) for the summary line.
#include <chrono>
#include <map>
#include <string>

namespace pdtrain {

inline double now_seconds() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

class PhaseTimers {
 public:
  void add(const std::string& phase, double seconds) { total_[phase] += seconds; }
  double get(const std::string& phase) const {
    auto it = total_.find(phase);
    return it == total_.end() ? 0.0 : it->second;
  }
  const std::map<std::string, double>& all() const { return total_; }

 private:
  std::map<std::string, double> total_;
};

// Adds the lifetime of this object to one phase.
class ScopedPhase {
 public:
  ScopedPhase(PhaseTimers& t, const char* phase) : t_(t), phase_(phase), start_(now_seconds()) {}
  ~ScopedPhase() { t_.add(phase_, now_seconds() - start_); }
  ScopedPhase(const ScopedPhase&) = delete;
  ScopedPhase& operator=(const ScopedPhase&) = delete;

 private:
  PhaseTimers& t_;
  const char* phase_;
  double start_;
};

}  // namespace pdtrain
