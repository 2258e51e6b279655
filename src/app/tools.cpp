#include "pdtrain/app/tools.hpp"

#include <cstdio>

#include "pdtrain/ckpt/checkpoint.hpp"
#include "pdtrain/core/error.hpp"
#include "pdtrain/model/llmc_format.hpp"

namespace pdtrain {

void inspect_checkpoint(const std::string& path) {
  bool intact = false;
  std::fputs(ckpt::inspect(path, &intact).c_str(), stdout);
  std::fflush(stdout);
  if (!intact)  // a script checking a checkpoint must not read "damaged" as success
    throw Error(ExitCode::data, path + " is damaged or incomplete (see above)");
}

void export_llmc(const std::string& checkpoint, const std::string& out) {
  const ckpt::CheckpointMeta meta = ckpt::read_meta(checkpoint);
  ModelShape shape = meta.shape;
  shape.seq_len = shape.max_seq_len;
  const ParamCatalog cat(shape);
  std::vector<int> all;
  for (const BlockInfo& b : cat.blocks()) all.push_back(b.id);
  const ckpt::Checkpoint c = ckpt::read_checkpoint(checkpoint, cat, MPI_COMM_SELF, all);
  std::vector<float> canonical(static_cast<std::size_t>(cat.total_numel()));
  for (const auto& [id, state] : c.blocks) cat.scatter_block(cat.block(id), state.param.data(), canonical.data());
  write_llmc(out, cat, canonical.data());
  std::printf("exported %s (step %lld%s) to %s in llm.c's format\n", checkpoint.c_str(),
              static_cast<long long>(meta.step),
              meta.codec == ckpt::Codec::bitdelta ? ", approximate bitdelta parameters" : "",
              out.c_str());
}

}  // namespace pdtrain
