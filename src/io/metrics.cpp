#include "pdtrain/io/metrics.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <cstring>

#include "pdtrain/core/error.hpp"

namespace pdtrain {

namespace {
const char* kHeader =
    "step,loss,val_loss,lr,grad_norm,tokens_per_s,step_ms,fetch_ms,compute_ms,reduce_ms,push_ms,"
    "bubble\n";

// The rows of steps <= last of an existing metrics file, written back atomically.
void keep_rows_up_to(const std::string& path, std::int64_t last) {
  std::ifstream in(path);
  if (!in) return;
  std::string line, kept = kHeader;
  std::getline(in, line);  // header
  while (std::getline(in, line))
    if (!line.empty() && std::atoll(line.c_str()) <= last) kept += line + "\n";
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp) << kept;
  std::filesystem::rename(tmp, path);
}
}  // namespace

MetricsWriter::MetricsWriter(const std::string& path, std::int64_t resume_step) {
  const bool resume = resume_step > 0 && std::filesystem::exists(path);
  if (resume) keep_rows_up_to(path, resume_step);
  f_ = std::fopen(path.c_str(), resume ? "a" : "w");
  if (!f_) throw Error(ExitCode::runtime, "cannot write " + path + ": " + std::strerror(errno));
  if (!resume) std::fputs(kHeader, f_);
  std::fflush(f_);
}

MetricsWriter::~MetricsWriter() {
  if (f_) std::fclose(f_);
}

void MetricsWriter::append(const StepRecord& r) {
  char val[32] = "";
  if (!std::isnan(r.val_loss)) std::snprintf(val, sizeof(val), "%.9g", r.val_loss);
  std::fprintf(f_, "%lld,%.9g,%s,%.9g,%.9g,%.1f,%.3f,%.3f,%.3f,%.3f,%.3f,%.4f\n",
               static_cast<long long>(r.step), r.loss, val, r.lr, r.grad_norm, r.tokens_per_s,
               r.step_ms, r.fetch_ms, r.compute_ms, r.reduce_ms, r.push_ms, r.bubble);
  std::fflush(f_);
}

std::string format_duration(double seconds) {
  const long s = std::lround(std::max(0.0, seconds));
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof(buf), "%ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
  else
    std::snprintf(buf, sizeof(buf), "%ld:%02ld", s / 60, s % 60);
  return buf;
}

std::string format_step_line(const StepRecord& r, std::int64_t total_steps, double eta_seconds) {
  char val[40] = "";
  if (!std::isnan(r.val_loss)) std::snprintf(val, sizeof(val), " | val %.6f", r.val_loss);
  char buf[256];
  const int width = static_cast<int>(std::to_string(total_steps).size());
  std::snprintf(buf, sizeof(buf),
                "step %*lld/%lld | loss %.9g%s | lr %.2e | norm %.3f | %.0f tok/s | %.1f ms | ETA %s",
                width, static_cast<long long>(r.step), static_cast<long long>(total_steps), r.loss,
                val, r.lr, r.grad_norm, r.tokens_per_s, r.step_ms,
                format_duration(eta_seconds).c_str());
  return buf;
}

}  // namespace pdtrain
