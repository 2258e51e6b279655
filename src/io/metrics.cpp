#include "pdtrain/io/metrics.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <cstring>
#include <iterator>

#include "pdtrain/core/error.hpp"
#include "pdtrain/io/output_file.hpp"

namespace pdtrain {

namespace {
const char* kHeader =
    "step,loss,val_loss,lr,grad_norm,tokens_per_s,step_ms,fetch_ms,compute_ms,reduce_ms,push_ms,"
    "bubble\n";

}  // namespace

bool keep_csv_rows_up_to(const std::string& path, const std::string& header, std::int64_t last) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  const std::string old(std::istreambuf_iterator<char>(in), {});
  if (in.bad()) throw Error(ExitCode::data, "cannot read " + path + ": " + std::strerror(errno));
  std::string kept = header;
  std::size_t begin = old.find('\n');  // past the header
  while (begin != std::string::npos && begin + 1 < old.size()) {
    const std::size_t end = old.find('\n', begin + 1);
    if (end == std::string::npos) break;  // a last row without its newline: cut short
    const std::string row = old.substr(begin + 1, end - begin);
    if (row.size() > 1 && std::atoll(row.c_str()) <= last) kept += row;
    begin = end;
  }
  if (kept != old) write_file_atomically(path, kept);
  return true;
}

MetricsWriter::MetricsWriter(const std::string& path, std::int64_t resume_step) {
  const bool resume = resume_step > 0 && keep_csv_rows_up_to(path, kHeader, resume_step);
  file_ = std::make_unique<OutputFile>(
      path, resume ? OutputFile::Mode::append : OutputFile::Mode::truncate);
  if (!resume) file_->write(kHeader);
}

MetricsWriter::~MetricsWriter() = default;

void MetricsWriter::append(const StepRecord& r) {
  char val[32] = "";
  if (!std::isnan(r.val_loss)) std::snprintf(val, sizeof(val), "%.9g", r.val_loss);
  char row[512];
  const int n = std::snprintf(row, sizeof(row), "%lld,%.9g,%s,%.9g,%.9g,%.1f,%.3f,%.3f,%.3f,%.3f,%.3f,%.4f\n",
               static_cast<long long>(r.step), r.loss, val, r.lr, r.grad_norm, r.tokens_per_s,
               r.step_ms, r.fetch_ms, r.compute_ms, r.reduce_ms, r.push_ms, r.bubble);
  PDT_CHECK(n > 0 && n < static_cast<int>(sizeof(row)), "metrics row longer than its buffer");
  file_->write(std::string_view(row, static_cast<std::size_t>(n)));  // one write(2): whole or cut off
}

void MetricsWriter::close() { file_->close(); }

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
