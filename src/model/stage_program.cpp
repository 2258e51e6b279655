#include "pdtrain/model/stage_program.hpp"

namespace pdtrain {

StageProgram::StageProgram(const StageParams& p) {
  using Kind = StageStep::Kind;
  const std::int64_t layers = p.spec().layer_end - p.spec().layer_begin;
  if (p.spec().has_embedding) steps_.push_back({Kind::embedding, 0, {p.wte_unit(), p.wpe_unit()}});
  for (std::int64_t i = 0; i < layers; ++i)
    steps_.push_back({Kind::layer, i, {static_cast<int>(i)}});
  if (p.spec().has_head) steps_.push_back({Kind::head, 0, {p.lnf_unit(), p.wte_unit()}});
}

std::vector<std::vector<int>> StageProgram::forward_uses() const {
  std::vector<std::vector<int>> uses;
  for (const StageStep& s : steps_) uses.push_back(s.units);
  return uses;
}

std::vector<std::vector<int>> StageProgram::backward_uses() const {
  std::vector<std::vector<int>> uses;
  for (auto s = steps_.rbegin(); s != steps_.rend(); ++s)
    if (s->backward_reads_params()) uses.push_back(s->units);
  return uses;
}

std::vector<std::vector<int>> StageProgram::backward_grad_uses() const {
  std::vector<std::vector<int>> uses;
  for (auto s = steps_.rbegin(); s != steps_.rend(); ++s) uses.push_back(s->units);
  return uses;
}

}  // namespace pdtrain
