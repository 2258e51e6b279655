#include "pdtrain/app/trajectories.hpp"

#include <cmath>
#include <cstdio>

#include "pdtrain/core/mpi_check.hpp"
#include "pdtrain/io/metrics.hpp"

namespace pdtrain {

TrajectoryRecorder::TrajectoryRecorder(const ParamCatalog& cat, std::int64_t every,
                                       MPI_Comm holders, const std::string& path,
                                       std::int64_t resume_step)
    : cat_(cat), every_(every), resume_step_(resume_step), holders_(holders), path_(path) {
  std::map<std::pair<int, std::int64_t>, int> row;
  for (const TensorInfo& t : cat.tensors())
    for (std::int64_t l = 0; l < t.layers; ++l) {
      row[{static_cast<int>(t.id), t.per_layer ? l : -1}] = static_cast<int>(names_.size());
      names_.push_back((t.per_layer ? "h." + std::to_string(l) + "." : std::string()) + t.name);
    }
  for (const BlockInfo& b : cat.blocks())
    row_of_block_.push_back(row.at({static_cast<int>(b.tensor), b.layer}));
}

void TrajectoryRecorder::after_update(std::int64_t version, const HolderHooks::BlocksGetter& get) {
  const bool record = version % every_ == 0 && previous_version_ == version - 1;
  const bool keep = (version + 1) % every_ == 0;
  if (!record && !keep) return;
  const HolderHooks::OwnedBlocks blocks = get();
  if (record) {
    // Per row: sum of p^2, then sum of (p - p_prev)^2, in block order within this holder.
    std::vector<double> sums(2 * names_.size(), 0.0);
    for (const auto& [id, state] : blocks) {
      const std::vector<float>& before = previous_.at(id);
      const std::size_t r = static_cast<std::size_t>(row_of_block_[id]);
      for (std::size_t i = 0; i < state->param.size(); ++i) {
        const double p = state->param[i], d = p - before[i];
        sums[2 * r] += p * p;
        sums[2 * r + 1] += d * d;
      }
    }
    int rank = 0, size = 0;
    MPI_CHECK(MPI_Comm_rank(holders_, &rank));
    MPI_CHECK(MPI_Comm_size(holders_, &size));
    std::vector<double> all(rank == 0 ? sums.size() * size : 0);
    MPI_CHECK(MPI_Gather(sums.data(), static_cast<int>(sums.size()), MPI_DOUBLE, all.data(),
                         static_cast<int>(sums.size()), MPI_DOUBLE, 0, holders_));
    if (rank == 0) {
      std::vector<double> total(sums.size(), 0.0);
      for (int h = 0; h < size; ++h)  // holder order: the figures never depend on timing
        for (std::size_t i = 0; i < total.size(); ++i) total[i] += all[h * total.size() + i];
      write_rows(version, total);
    }
  }
  previous_.clear();
  previous_version_ = -1;
  if (keep) {
    for (const auto& [id, state] : blocks) previous_[id] = state->param;
    previous_version_ = version;
  }
}

void TrajectoryRecorder::write_rows(std::int64_t version, const std::vector<double>& sums) {
  if (!out_) {
    const std::string header = "step,tensor,param_norm,update_norm,update_to_weight\n";
    const bool resume = resume_step_ > 0 && keep_csv_rows_up_to(path_, header, resume_step_);
    out_ = std::make_unique<OutputFile>(
        path_, resume ? OutputFile::Mode::append : OutputFile::Mode::truncate);
    if (!resume) out_->write(header);
  }
  std::string rows;
  char line[256];
  for (std::size_t r = 0; r < names_.size(); ++r) {
    const double p = std::sqrt(sums[2 * r]), u = std::sqrt(sums[2 * r + 1]);
    std::snprintf(line, sizeof line, "%lld,%s,%.9g,%.9g,%.9g\n", static_cast<long long>(version),
                  names_[r].c_str(), p, u, p > 0 ? u / p : 0.0);
    rows += line;
  }
  out_->write(rows);  // one write per step: a job that dies keeps whole steps
}

HolderHooks TrajectoryRecorder::with_trajectories(HolderHooks hooks,
                                                  std::shared_ptr<TrajectoryRecorder> r) {
  auto inner = hooks.after_update;
  hooks.after_update = [inner, r](std::int64_t version, const HolderHooks::BlocksGetter& blocks) {
    r->after_update(version, blocks);
    if (inner) inner(version, blocks);
  };
  return hooks;
}

}  // namespace pdtrain
