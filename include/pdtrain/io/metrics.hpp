#pragma once
// The per-step record: one line on stdout and one row of OUT/metrics.csv, flushed as written
// so that a run that dies keeps every completed step.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

namespace pdtrain {

struct StepRecord {
  std::int64_t step = 0;
  double loss = 0.0;
  double val_loss = NAN;  // NaN: not evaluated at this step
  double lr = 0.0;
  double grad_norm = 0.0;
  double tokens_per_s = 0.0;
  double step_ms = 0.0;
  double fetch_ms = 0.0;    // time this rank waited for parameters
  double compute_ms = 0.0;  // forward + backward
  double reduce_ms = 0.0;   // data-parallel gradient reduction
  double push_ms = 0.0;     // gradient push (or local update in the baseline)
  double bubble = 0.0;      // measured pipeline bubble: share of the pipeline phase spent waiting
};

class MetricsWriter {
 public:
  // Creates `path` with its header; when resuming after `resume_step` > 0, keeps the rows of
  // steps 1..resume_step already there (dropping any written after that checkpoint by the
  // interrupted run) and appends.
  explicit MetricsWriter(const std::string& path, std::int64_t resume_step = 0);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  void append(const StepRecord& r);

 private:
  std::FILE* f_ = nullptr;
};

// "step   12/300 | loss 3.123456789 | val 3.2 | lr 3.00e-03 | norm 0.812 | 51234 tok/s | 12.3 ms | ETA 0:42"
std::string format_step_line(const StepRecord& r, std::int64_t total_steps, double eta_seconds);
std::string format_duration(double seconds);

}  // namespace pdtrain
