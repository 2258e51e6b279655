#include "pdtrain/app/tools.hpp"

#include <cstdio>

#include "pdtrain/ckpt/checkpoint.hpp"
#include "pdtrain/core/error.hpp"
#include "pdtrain/interop/hf_gpt2.hpp"
#include "pdtrain/model/llmc_format.hpp"

namespace pdtrain {

void inspect_checkpoint(const std::string& path) {
  bool intact = false;
  std::fputs(ckpt::inspect(path, &intact).c_str(), stdout);
  std::fflush(stdout);
  if (!intact)  // a script checking a checkpoint must not read "damaged" as success
    throw Error(ExitCode::data, path + " is damaged or incomplete (see above)");
}

namespace {

// A checkpoint's parameters as the canonical flat array of its model (at its full context).
struct CheckpointParams {
  ckpt::CheckpointMeta meta;
  ParamCatalog catalog;
  std::vector<float> canonical;
};

CheckpointParams read_params(const std::string& checkpoint) {
  const ckpt::CheckpointMeta meta = ckpt::read_meta(checkpoint);
  ModelShape shape = meta.shape;
  shape.seq_len = shape.max_seq_len;
  CheckpointParams p{meta, ParamCatalog(shape), {}};
  std::vector<int> all;
  for (const BlockInfo& b : p.catalog.blocks()) all.push_back(b.id);
  const ckpt::Checkpoint c = ckpt::read_checkpoint(checkpoint, p.catalog, MPI_COMM_SELF, all);
  p.canonical.resize(static_cast<std::size_t>(p.catalog.total_numel()));
  for (const auto& [id, state] : c.blocks)
    p.catalog.scatter_block(p.catalog.block(id), state.param.data(), p.canonical.data());
  return p;
}

void print_exported(const std::string& checkpoint, const ckpt::CheckpointMeta& meta,
                    const std::string& out, const char* format) {
  std::printf("exported %s (step %lld%s) to %s in %s\n", checkpoint.c_str(),
              static_cast<long long>(meta.step),
              meta.codec == ckpt::Codec::bitdelta ? ", approximate bitdelta parameters" : "",
              out.c_str(), format);
}

}  // namespace

void export_llmc(const std::string& checkpoint, const std::string& out) {
  const CheckpointParams p = read_params(checkpoint);
  write_llmc(out, p.catalog, p.canonical.data());
  print_exported(checkpoint, p.meta, out, "llm.c's format");
}

void export_hf(const std::string& checkpoint, const std::string& out_dir) {
  const CheckpointParams p = read_params(checkpoint);
  write_hf(out_dir, p.catalog, p.canonical.data());
  print_exported(checkpoint, p.meta, out_dir, "Hugging Face's format (config.json, model.safetensors)");
}

}  // namespace pdtrain
