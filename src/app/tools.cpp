#include "pdtrain/app/tools.hpp"

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>

#include "pdtrain/ckpt/checkpoint.hpp"
#include "pdtrain/core/error.hpp"
#include "pdtrain/interop/hf_gpt2.hpp"
#include "pdtrain/interop/llmc_tokenizer.hpp"
#include "pdtrain/model/llmc_format.hpp"

namespace pdtrain {

void inspect_checkpoint(const std::string& path) {
  bool intact = false;
  std::fputs(ckpt::inspect(path, &intact).c_str(), stdout);
  std::fflush(stdout);
  if (!intact)  // a script checking a checkpoint must not read "damaged" as success
    throw Error(ExitCode::data, path + " is damaged or incomplete (see above)");
}

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

namespace {

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

namespace {

// Whether the checkpoint's run read bytes of text (its resolved deck says).
bool trained_on_bytes(const ckpt::CheckpointMeta& meta) {
  return parse_deck(meta.deck, meta.path + " (its deck)", {}).data.source == "text";
}

std::vector<std::int32_t> prompt_tokens(const SampleCommand& c, bool bytes, std::int64_t vocab) {
  std::vector<std::int32_t> t;
  if (!c.has_prompt) return {bytes ? std::int32_t{'\n'} : vocab == 50257 ? 50256 : 0};
  if (bytes) {
    for (unsigned char ch : c.prompt) t.push_back(ch);
    return t;
  }
  std::string ids = c.prompt;
  for (char& ch : ids) if (ch == ',') ch = ' ';
  std::istringstream in(ids);
  std::string word;
  while (in >> word) {
    char* end = nullptr;
    const long v = std::strtol(word.c_str(), &end, 10);
    if (*end != '\0')
      throw Error(ExitCode::deck, "--prompt: '" + word + "' is not a token id (the model was " +
                                      "trained on token shards; give ids such as \"464 3290\")");
    t.push_back(static_cast<std::int32_t>(v));
  }
  return t;
}

}  // namespace

void sample_checkpoint(const SampleCommand& c) {
  const CheckpointParams p = read_params(c.checkpoint);
  const bool bytes = trained_on_bytes(p.meta);
  const std::vector<std::int32_t> context = prompt_tokens(c, bytes, p.catalog.shape().vocab_size);
  std::unique_ptr<LlmcTokenizer> tokenizer;
  if (!c.tokenizer.empty()) tokenizer = std::make_unique<LlmcTokenizer>(c.tokenizer);
  const std::vector<std::int32_t> out = generate(p.catalog, p.canonical, context, c.settings);
  std::vector<std::int32_t> all = context;
  all.insert(all.end(), out.begin(), out.end());
  std::string text;
  if (tokenizer && !bytes)
    for (std::int32_t t : all) text += tokenizer->decode(t);
  else
    text = tokens_text(all, bytes);
  std::printf("%s\n", text.c_str());
  std::fflush(stdout);
}

}  // namespace pdtrain
