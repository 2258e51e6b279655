#pragma once
// A per-rank timeline in Chrome trace JSON (opens in Perfetto or chrome://tracing): one
// "complete" event per phase (fetch, forward/backward of a micro-batch, send, receive, push,
// holder update). Disabled recorders cost one branch per event.
#include <cstdint>
#include <string>
#include <vector>

namespace pdtrain {

class TraceRecorder {
 public:
  TraceRecorder() = default;  // disabled
  // `epoch` (seconds, now_seconds() clock) is shared by all ranks so timelines line up.
  TraceRecorder(int rank, std::string role, double epoch);
  bool enabled() const { return enabled_; }
  // An event from t0 to t1 (seconds on the now_seconds() clock).
  void event(const std::string& name, const char* category, double t0, double t1);
  // Writes this rank's events as a JSON object {"traceEvents": [...]} (write_file_atomically:
  // Error(data) naming the file when it cannot).
  void write(const std::string& path) const;
  // Concatenates several rank files into one, written the same way.
  static void merge(const std::vector<std::string>& rank_files, const std::string& out);

 private:
  struct Event {
    std::string name;
    const char* category;
    double t0, t1;
  };
  bool enabled_ = false;
  int rank_ = 0;
  std::string role_;
  double epoch_ = 0.0;
  std::vector<Event> events_;
};

// Records the lifetime of this object as one event.
class TraceSpan {
 public:
  TraceSpan(TraceRecorder* t, std::string name, const char* category);
  ~TraceSpan();
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  TraceRecorder* t_;
  std::string name_;
  const char* category_;
  double t0_;
};

}  // namespace pdtrain
