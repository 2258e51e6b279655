#include "pdtrain/io/trace.hpp"

#include <fstream>
#include <sstream>

#include "pdtrain/core/error.hpp"
#include "pdtrain/core/timer.hpp"
#include "pdtrain/io/output_file.hpp"

namespace pdtrain {

TraceRecorder::TraceRecorder(int rank, std::string role, double epoch)
    : enabled_(true), rank_(rank), role_(std::move(role)), epoch_(epoch) {}

void TraceRecorder::event(const std::string& name, const char* category, double t0, double t1) {
  if (enabled_) events_.push_back({name, category, t0, t1});
}

void TraceRecorder::write(const std::string& path) const {
  std::ostringstream f;
  f << "{\"traceEvents\": [\n";
  // Metadata: name the process row after the rank and its role.
  f << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" << rank_
    << ",\"args\":{\"name\":\"rank " << rank_ << " (" << role_ << ")\"}}";
  char buf[512];
  for (const Event& e : events_) {
    std::snprintf(buf, sizeof(buf),
                  ",\n{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":0,"
                  "\"ts\":%.1f,\"dur\":%.1f}",
                  e.name.c_str(), e.category, rank_, (e.t0 - epoch_) * 1e6, (e.t1 - e.t0) * 1e6);
    f << buf;
  }
  f << "\n]}\n";
  write_file_atomically(path, f.str());
}

void TraceRecorder::merge(const std::vector<std::string>& rank_files, const std::string& out) {
  std::ostringstream f;
  f << "{\"traceEvents\": [\n";
  bool first = true;
  for (const std::string& path : rank_files) {
    std::ifstream in(path);
    if (!in) throw Error(ExitCode::data, "cannot read trace " + path);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string body = ss.str();
    // Strip this file's {"traceEvents": [ ... ]} wrapper and splice its events in.
    const auto open = body.find('[');
    const auto close = body.rfind(']');
    if (open == std::string::npos || close == std::string::npos || close <= open) continue;
    const std::string events = body.substr(open + 1, close - open - 1);
    if (events.find_first_not_of(" \n") == std::string::npos) continue;
    f << (first ? "" : ",\n") << events;
    first = false;
  }
  f << "\n]}\n";
  write_file_atomically(out, f.str());
}

TraceSpan::TraceSpan(TraceRecorder* t, std::string name, const char* category)
    : t_(t && t->enabled() ? t : nullptr), category_(category), t0_(0.0) {
  if (t_) {
    name_ = std::move(name);
    t0_ = now_seconds();
  }
}

TraceSpan::~TraceSpan() {
  if (t_) t_->event(name_, category_, t0_, now_seconds());
}

}  // namespace pdtrain
