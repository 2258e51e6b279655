#pragma once
// The per-step record: one line on stdout and one row of OUT/metrics.csv, written (write(2))
// as it comes so that a run that dies keeps every completed step; a row that cannot be written
// whole (a full disk) is cut off again and ends the run with Error(data) naming the file.
#include <cmath>
#include <cstdint>
#include <memory>
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

class OutputFile;

class MetricsWriter {
 public:
  // Creates `path` with its header; when resuming after `resume_step` > 0, keeps the rows of
  // steps 1..resume_step already there (dropping any written after that checkpoint by the
  // interrupted run: the file is then rewritten through a checked temporary, so a failure
  // loses no row) and appends. Throws Error(data) naming the file when it cannot.
  explicit MetricsWriter(const std::string& path, std::int64_t resume_step = 0);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  void append(const StepRecord& r);
  // fsync and close at the end of the run, where a full disk may show only now.
  void close();

 private:
  std::unique_ptr<OutputFile> file_;
};

// "step   12/300 | loss 3.123456789 | val 3.2 | lr 3.00e-03 | norm 0.812 | 51234 tok/s | 12.3 ms | ETA 0:42"
// Keeps the rows of steps <= last of an existing CSV file whose rows begin with their step
// (dropping those an interrupted run wrote after its last checkpoint, and a row cut short),
// under `header`. A file that changes is rewritten whole through a checked, fsync'ed temporary
// and a rename: a failure (a full disk) leaves it as it was. Returns false if there is no file.
bool keep_csv_rows_up_to(const std::string& path, const std::string& header, std::int64_t last);

std::string format_step_line(const StepRecord& r, std::int64_t total_steps, double eta_seconds);
std::string format_duration(double seconds);

}  // namespace pdtrain
