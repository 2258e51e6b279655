#pragma once
// `pdtrain summarize DIR`: one row per run found under DIR (each subdirectory with a
// metrics.csv, e.g. the points of a sweep) with its final and best validation loss, throughput
// and wall time, written as DIR/summary.csv and DIR/summary.md, and the runs' loss curves as
// DIR/loss_curves.svg.
#include <string>
#include <vector>

namespace pdtrain {

struct RunSummary {
  std::string name;
  long long steps = 0;
  double final_loss = 0.0, final_val = 0.0, best_val = 0.0;  // NaN when never validated
  double tokens_per_s = 0.0, wall_s = 0.0;
  std::vector<std::pair<long long, double>> loss, val;  // (step, value)
};

// Reads one run's metrics.csv; Error(ExitCode::data) if it is unreadable or malformed.
RunSummary read_run_summary(const std::string& metrics_csv, const std::string& name);

// Summarizes every run under `dir` and prints the Markdown table; returns the runs found.
std::vector<RunSummary> summarize_runs(const std::string& dir);

}  // namespace pdtrain
