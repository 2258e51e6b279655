#include "pdtrain/io/summary.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <type_traits>

#include "pdtrain/core/error.hpp"
#include "pdtrain/io/output_file.hpp"

namespace pdtrain {

namespace fs = std::filesystem;

namespace {

std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> out;
  std::stringstream ss(line);
  std::string cell;
  while (std::getline(ss, cell, ',')) out.push_back(cell);
  if (!line.empty() && line.back() == ',') out.emplace_back();
  return out;
}

// One row of metrics.csv, read with its place in the file so a bad cell is reported as
// FILE:LINE:COLUMN (the character column where the cell starts) with the column's name.
struct CsvRow {
  const std::string& file;
  long long line;
  const std::vector<std::string>& head;
  std::vector<std::string> cells;

  std::size_t char_column(std::size_t index) const {
    std::size_t col = 1;
    for (std::size_t i = 0; i < index; ++i) col += cells[i].size() + 1;
    return col;
  }

  template <class T>
  T number(std::size_t index) const {
    const std::string& cell = cells[index];
    T v{};
    const auto [end, ec] = std::from_chars(cell.data(), cell.data() + cell.size(), v);
    if (ec == std::errc() && end == cell.data() + cell.size() && !cell.empty()) return v;
    throw Error(ExitCode::data, file + ":" + std::to_string(line) + ":" +
                                    std::to_string(char_column(index)) + ": column '" +
                                    head[index] + "': expected " +
                                    (std::is_integral_v<T> ? "an integer" : "a number") +
                                    ", got '" + cell + "'");
  }
};

std::string fmt(double v, const char* f = "%.4f") {
  if (std::isnan(v)) return "";
  char buf[32];
  std::snprintf(buf, sizeof(buf), f, v);
  return buf;
}

// One curve of a chart: a line and, optionally, dots (validation losses).
struct Series {
  std::string name;
  std::vector<std::pair<long long, double>> line, dots;
};

// A chart of series over steps, one colour each, with a legend; `log_y`: values drawn on a
// log10 axis (values <= 0 left out).
std::string svg_chart(const std::string& title, const std::vector<Series>& series, bool log_y) {
  const double W = 800, H = 480, L = 60, R = 220, T = 20, B = 40;
  auto scale = [log_y](double v) { return log_y ? std::log10(v) : v; };
  auto shown = [log_y](double v) { return !log_y || v > 0; };
  long long max_step = 1;
  double lo = 1e300, hi = -1e300;
  for (const Series& r : series)
    for (const auto& [s, v] : r.line)
      if (shown(v)) {
        max_step = std::max(max_step, s);
        lo = std::min(lo, scale(v)), hi = std::max(hi, scale(v));
      }
  if (lo > hi) lo = 0, hi = 1;
  if (hi - lo < 1e-9) hi = lo + 1;
  auto x = [&](double s) { return L + (W - L - R) * s / static_cast<double>(max_step); };
  auto y = [&](double v) { return T + (H - T - B) * (hi - scale(v)) / (hi - lo); };
  const char* colors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                          "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  std::ostringstream f;
  f << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"" << L << "\" y=\"14\">" << title << "</text>\n";
  for (int i = 0; i <= 4; ++i) {  // y grid with labels
    const double v = lo + (hi - lo) * i / 4.0, yv = T + (H - T - B) * (hi - v) / (hi - lo);
    f << "<line x1=\"" << L << "\" x2=\"" << W - R << "\" y1=\"" << yv << "\" y2=\"" << yv
      << "\" stroke=\"#ddd\"/><text x=\"4\" y=\"" << yv + 4 << "\">"
      << fmt(log_y ? std::pow(10.0, v) : v, log_y ? "%.2g" : "%.3f") << "</text>\n";
  }
  f << "<text x=\"" << (W - R) / 2 << "\" y=\"" << H - 8 << "\">step (0.." << max_step << ")</text>\n";
  for (std::size_t i = 0; i < series.size(); ++i) {
    const char* c = colors[i % 10];
    const char* dash = i / 10 % 2 ? "\" stroke-dasharray=\"4 2" : "";  // 11th colour on: dashed
    f << "<polyline fill=\"none\" stroke=\"" << c << dash << "\" stroke-width=\"1.5\" points=\"";
    for (const auto& [s, v] : series[i].line)
      if (shown(v)) f << x(static_cast<double>(s)) << "," << y(v) << " ";
    f << "\"/>\n";
    for (const auto& [s, v] : series[i].dots)
      if (shown(v))
        f << "<circle cx=\"" << x(static_cast<double>(s)) << "\" cy=\""
          << std::clamp(y(v), T, H - B) << "\" r=\"3\" fill=\"" << c << "\"/>\n";
    f << "<rect x=\"" << W - R + 10 << "\" y=\"" << T + 16 * i << "\" width=\"10\" height=\"10\" fill=\""
      << c << "\"/><text x=\"" << W - R + 26 << "\" y=\"" << T + 16 * i + 9 << "\">"
      << series[i].name << "</text>\n";
  }
  f << "</svg>\n";
  return f.str();
}

void write_svg(const std::vector<RunSummary>& runs, const std::string& path) {
  std::vector<Series> series;
  for (const RunSummary& r : runs) series.push_back({r.name, r.loss, r.val});
  write_file_atomically(
      path, svg_chart("training loss (lines) and validation loss (dots)", series, false));
}

// A run's OUT/trajectories.csv as one update-to-weight curve per tensor, its layers combined
// (sqrt of the summed squared update norms over sqrt of the summed squared parameter norms).
std::vector<Series> trajectory_series(const std::string& csv) {
  std::ifstream in(csv);
  std::string line;
  std::getline(in, line);
  const std::vector<std::string> head = split_csv(line);
  std::vector<std::string> order;
  std::map<std::string, std::map<long long, std::pair<double, double>>> sums;
  for (long long row = 2; std::getline(in, line); ++row) {
    const CsvRow cells{csv, row, head, split_csv(line)};
    if (cells.cells.size() < 5)
      throw Error(ExitCode::data, csv + ":" + std::to_string(row) + ": short row");
    std::string tensor = cells.cells[1];
    if (tensor.rfind("h.", 0) == 0) tensor = tensor.substr(tensor.find('.', 2) + 1);  // h.3.qkvw
    if (!sums.count(tensor)) order.push_back(tensor);
    auto& [p2, u2] = sums[tensor][cells.number<long long>(0)];
    p2 += std::pow(cells.number<double>(2), 2);
    u2 += std::pow(cells.number<double>(3), 2);
  }
  std::vector<Series> out;
  for (const std::string& tensor : order) {
    Series s{tensor, {}, {}};
    for (const auto& [step, pu] : sums[tensor])
      s.line.emplace_back(step, pu.first > 0 ? std::sqrt(pu.second / pu.first) : 0.0);
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace

RunSummary read_run_summary(const std::string& metrics_csv, const std::string& name) {
  std::ifstream in(metrics_csv);
  if (!in) throw Error(ExitCode::data, "cannot read " + metrics_csv);
  std::string line;
  std::getline(in, line);
  const std::vector<std::string> head = split_csv(line);
  auto column = [&](const char* want) {
    const auto it = std::find(head.begin(), head.end(), want);
    if (it == head.end())
      throw Error(ExitCode::data, metrics_csv + ":1: the header has no column '" + want + "'");
    return static_cast<std::size_t>(it - head.begin());
  };
  const std::size_t c_step = column("step"), c_loss = column("loss"), c_val = column("val_loss"),
                    c_tps = column("tokens_per_s"), c_ms = column("step_ms");
  RunSummary r;
  r.name = name;
  r.final_val = r.best_val = NAN;
  double tokens = 0.0, ms = 0.0;
  for (long long row = 2; std::getline(in, line); ++row) {
    const CsvRow cells{metrics_csv, row, head, split_csv(line)};
    if (cells.cells.size() < head.size())
      throw Error(ExitCode::data, metrics_csv + ":" + std::to_string(row) + ": short row (" +
                                      std::to_string(cells.cells.size()) + " of " +
                                      std::to_string(head.size()) + " columns)");
    const auto step = cells.number<long long>(c_step);
    r.steps = step;
    r.final_loss = cells.number<double>(c_loss);
    r.loss.emplace_back(step, r.final_loss);
    if (!cells.cells[c_val].empty()) {
      const auto v = cells.number<double>(c_val);
      r.val.emplace_back(step, v);
      r.final_val = v;
      r.best_val = std::isnan(r.best_val) ? v : std::min(r.best_val, v);
    }
    const auto step_ms = cells.number<double>(c_ms);
    tokens += cells.number<double>(c_tps) * step_ms / 1e3;
    ms += step_ms;
  }
  r.wall_s = ms / 1e3;
  r.tokens_per_s = ms > 0 ? tokens / (ms / 1e3) : 0.0;
  return r;
}

std::vector<RunSummary> summarize_runs(const std::string& dir) {
  if (!fs::is_directory(dir)) throw Error(ExitCode::data, "summarize: no directory " + dir);
  std::vector<RunSummary> runs;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_directory() && fs::exists(e.path() / "metrics.csv"))
      runs.push_back(read_run_summary((e.path() / "metrics.csv").string(), e.path().filename().string()));
  if (runs.empty()) throw Error(ExitCode::data, "summarize: no run with a metrics.csv under " + dir);
  // Sweep points are named "<N>-<label>": order them by N.
  std::sort(runs.begin(), runs.end(), [](const RunSummary& a, const RunSummary& b) {
    const long long na = std::atoll(a.name.c_str()), nb = std::atoll(b.name.c_str());
    return na != nb ? na < nb : a.name < b.name;
  });
  std::ostringstream csv, md;
  csv << "run,steps,final_loss,final_val_loss,best_val_loss,tokens_per_s,wall_s\n";
  md << "| run | steps | final loss | final val loss | best val loss | tokens/s | wall s |\n"
     << "|---|---|---|---|---|---|---|\n";
  for (const RunSummary& r : runs) {
    csv << r.name << "," << r.steps << "," << fmt(r.final_loss, "%.6f") << ","
        << fmt(r.final_val, "%.6f") << "," << fmt(r.best_val, "%.6f") << ","
        << fmt(r.tokens_per_s, "%.0f") << "," << fmt(r.wall_s, "%.2f") << "\n";
    md << "| " << r.name << " | " << r.steps << " | " << fmt(r.final_loss) << " | "
       << fmt(r.final_val) << " | " << fmt(r.best_val) << " | " << fmt(r.tokens_per_s, "%.0f")
       << " | " << fmt(r.wall_s, "%.2f") << " |\n";
  }
  write_file_atomically(dir + "/summary.csv", csv.str());
  write_file_atomically(dir + "/summary.md", md.str());
  write_svg(runs, dir + "/loss_curves.svg");
  // Beside the loss curves, each run's parameter trajectories (output.trajectory_every).
  for (const RunSummary& r : runs) {
    const fs::path csv = fs::path(dir) / r.name / "trajectories.csv";
    if (!fs::exists(csv)) continue;
    const std::string svg = dir + "/trajectories-" + r.name + ".svg";
    write_file_atomically(svg, svg_chart(r.name + ": update-to-weight ratio per tensor (log scale)",
                                         trajectory_series(csv.string()), true));
    std::printf("wrote %s\n", svg.c_str());
  }
  std::printf("%s", md.str().c_str());
  std::printf("wrote %s/summary.csv, %s/summary.md, %s/loss_curves.svg\n", dir.c_str(),
              dir.c_str(), dir.c_str());
  return runs;
}

}  // namespace pdtrain
