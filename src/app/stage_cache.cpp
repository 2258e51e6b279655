#include "pdtrain/app/stage_cache.hpp"

#include <cstdio>
#include <sstream>

#include "pdtrain/core/error.hpp"
#include "pdtrain/io/output_file.hpp"
#include "pdtrain/model/stage_program.hpp"

namespace pdtrain {

StageCache::StageCache(StageParams& params, ParameterService& service,
                       std::int64_t capacity_bytes, int prefetch_depth, TraceRecorder* trace,
                       std::int64_t warm_versions)
    : params_(params), bound_(capacity_bytes), warm_versions_(warm_versions),
      cache_(service, units_of(params), *this, capacity_bytes, prefetch_depth, trace,
             params.device()) {
  params_.set_unit_user(this);
}

StageCache::~StageCache() { params_.set_unit_user(nullptr); }

std::vector<CacheUnit> StageCache::units_of(const StageParams& p) {
  std::vector<CacheUnit> units;
  for (int u = 0; u < p.num_units(); ++u)
    units.push_back(CacheUnit{p.unit_name(u), p.unit_storage(u), p.unit_blocks(u)});
  return units;
}

std::vector<std::vector<int>> StageCache::step_plan(const StageParams& p, PipelineKind kind,
                                                    int stages, int stage, int micro_batches) {
  const auto fwd = StageProgram(p).forward_uses(), bwd = StageProgram(p).backward_uses();
  std::vector<std::vector<int>> plan;
  for (const PipelineAction& a : pipeline_actions(kind, stages, stage, micro_batches)) {
    if (a.kind == ActionKind::forward) plan.insert(plan.end(), fwd.begin(), fwd.end());
    if (a.kind == ActionKind::backward) plan.insert(plan.end(), bwd.begin(), bwd.end());
  }
  return plan;
}

std::vector<std::vector<int>> StageCache::layer_major_plan(const StageParams& p) {
  const StageProgram program(p);
  std::vector<std::vector<int>> plan = program.forward_uses();
  for (std::vector<int>& use : program.backward_uses()) plan.push_back(std::move(use));
  return plan;
}

std::vector<std::vector<int>> StageCache::eval_plan(const StageParams& p, int forwards) {
  const auto fwd = StageProgram(p).forward_uses();
  std::vector<std::vector<int>> plan;
  for (int i = 0; i < forwards; ++i) plan.insert(plan.end(), fwd.begin(), fwd.end());
  return plan;
}

void StageCache::unpack(int block, const float* data) {
  params_.unpack_param(params_.catalog().block(block), data);
}

BlockPlace StageCache::place(int block, int elem_bytes) {
  return params_.block_place(params_.catalog().block(block), elem_bytes);
}

void StageCache::landed(int block, int elem_bytes, std::int64_t row_begin, std::int64_t row_end) {
  params_.finish_landed_rows(params_.catalog().block(block), elem_bytes, row_begin, row_end);
}

void StageCache::write_heat_map(const std::string& path) const {
  std::ostringstream f;
  f << "block,name,unit,bytes,uses,fetches\n";
  const CacheStats& s = cache_.stats();
  for (int u = 0; u < params_.num_units(); ++u)
    for (int b : params_.unit_blocks(u))
      f << b << ',' << params_.catalog().block_name(params_.catalog().block(b)) << ','
        << params_.unit_name(u) << ',' << params_.catalog().block(b).bytes() << ','
        << s.unit_uses[u] << ',' << s.unit_fetches[u] << '\n';
  write_file_atomically(path, f.str());
}

std::string StageCache::summary(double step_seconds) const {
  const CacheStats& s = cache_.stats();
  const double mib = 1024.0 * 1024.0;
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "cache: limit %s | peak %.1f MiB | uses %lld: hit %.1f %%, late %lld, miss %lld | "
                "fetched %.1f MiB (re-fetched %.1f MiB) | exposed wait %.2f s (%.1f %% of steps)",
                bound_ > 0
                    ? (std::to_string(static_cast<double>(bound_) / 1048576.0).substr(0, 6) + " MiB" +
                       (warm_versions_ > 0 ? " after " + std::to_string(warm_versions_) + " warm steps" : ""))
                          .c_str()
                    : "none",
                static_cast<double>(s.peak_bytes) / mib, static_cast<long long>(s.uses),
                s.uses > 0 ? 100.0 * static_cast<double>(s.hits) / static_cast<double>(s.uses)
                           : 0.0,
                static_cast<long long>(s.late), static_cast<long long>(s.misses),
                static_cast<double>(s.bytes_fetched) / mib,
                static_cast<double>(s.bytes_refetched) / mib, s.wait_seconds,
                step_seconds > 0 ? 100.0 * s.wait_seconds / step_seconds : 0.0);
  return buf;
}

}  // namespace pdtrain
