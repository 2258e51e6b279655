// Hugging Face GPT-2 in and out (issue 19): llm.c -> pdtrain checkpoint -> hf -> pdtrain
// checkpoint -> llm.c is byte-identical; a directory is the model (the default deck, whose model
// keys differ from the file's, evaluates it exactly as an llm.c file of the same parameters), and
// a deck key that contradicts the file is an error naming both.
#include <gtest/gtest.h>
#include <mpi.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "pdtrain/app/tools.hpp"
#include "pdtrain/ckpt/checkpoint.hpp"
#include "pdtrain/core/crc32c.hpp"
#include "pdtrain/interop/hf_gpt2.hpp"
#include "pdtrain/model/llmc_format.hpp"
#include "run_helpers.hpp"

namespace pdtrain::test {
namespace {

// A model unlike the default deck's in every shape key (2 heads, 16 channels, 40 tokens, 12
// positions, 3 layers).
const char* kModel = R"(
[model]
n_layer = 3
n_head = 2
d_model = 16
vocab_size = 40
seq_len = 10
max_seq_len = 12
)";

std::string temp(const std::string& name) { return temp_path("hf-" + name); }

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// pdtrain's initialization of kModel (seed 5) as an llm.c file.
std::string llmc_fixture(const ParamCatalog& cat) {
  const std::string p = temp("init.bin");
  std::vector<float> canonical(static_cast<std::size_t>(cat.total_numel()));
  for (const BlockInfo& b : cat.blocks()) {
    std::vector<float> packed(static_cast<std::size_t>(b.numel()));
    cat.init_block(b, 0.02, 5, packed.data());
    cat.scatter_block(b, packed.data(), canonical.data());
  }
  write_llmc(p, cat, canonical.data());
  return p;
}

// A pdtrain checkpoint (step 0) of the canonical parameters, in `dir`.
std::string checkpoint_of(const ParamCatalog& cat, const std::vector<float>& canonical,
                          const std::string& dir) {
  std::map<int, BlockState> states;
  ckpt::BlockRefs refs;
  for (const BlockInfo& b : cat.blocks()) {
    BlockState& s = states[b.id];
    s.param.resize(static_cast<std::size_t>(b.numel()));
    cat.gather_block(b, canonical.data(), s.param.data());
    s.m.assign(s.param.size(), 0.0f);
    s.v.assign(s.param.size(), 0.0f);
    refs[b.id] = &s;
  }
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const Deck d = parse_deck(kModel, "t.toml", {});
  ckpt::CheckpointWriter w(MPI_COMM_SELF, cat, ckpt::Codec::zstd, 1, dir, 0);
  return w.write(0, 0, 0, d.resolved_toml(), "test", refs);
}

struct Eval {
  double loss = 0;
  std::uint32_t crc = 0;
};

// `pdtrain eval` of the default deck (one rank, the baseline) with `sets`.
Eval eval_default_deck(const std::vector<std::string>& sets) {
  std::vector<std::string> all = {"parallel.holders=0"};
  all.insert(all.end(), sets.begin(), sets.end());
  const Deck d = parse_deck(default_deck_text(), kDefaultDeckName, all);
  RunOptions o;
  o.verbose = false;
  o.eval_batches = 2;
  const TrainResult r = run_training(d, MPI_COMM_SELF, o);
  return {r.val_losses.at(0), r.params_crc32c};
}

class HfInit : public ::testing::Test {
 protected:
  void SetUp() override {
    if (world_rank() != 0) GTEST_SKIP() << "one-rank test";
  }
  // The llm.c fixture, its parameters, and its export to the Hugging Face directory `name`
  // (llm.c file -> pdtrain checkpoint -> hf).
  void export_fixture(const std::string& name) {
    llmc = llmc_fixture(cat);
    read_llmc_params(llmc, cat, canonical);
    hf = temp(name);
    std::filesystem::remove_all(hf);
    export_hf(checkpoint_of(cat, canonical, temp("ckpt-" + name)), hf);
  }
  const ParamCatalog cat{resolve_model_shape(parse_deck(kModel, "t.toml", {}).model)};
  std::string llmc, hf;
  std::vector<float> canonical;
};

TEST_F(HfInit, LlmcToHfToLlmcIsByteIdentical) {
  export_fixture("roundtrip-hf");
  std::vector<float> back;
  read_hf_params(hf, cat, back);
  const std::string out = temp("roundtrip.bin");
  export_llmc(checkpoint_of(cat, back, temp("ckpt-b")), out);
  const std::string a = file_bytes(llmc), b = file_bytes(out);
  EXPECT_EQ(a.size(), b.size());
  EXPECT_TRUE(a == b) << "llm.c -> pdtrain -> hf -> pdtrain -> llm.c changed the file";
}

TEST_F(HfInit, DirectoryIsTheModel) {
  export_fixture("model-hf");
  // The default deck (2 layers, 4 heads, 64 channels, 64 tokens) takes the file's shape;
  // seq_len 64 is cut to the file's 12 positions.
  const Eval from_hf = eval_default_deck({"model.init=hf:" + hf});
  const Eval from_llmc = eval_default_deck({"model.init=llmc:" + llmc});
  EXPECT_EQ(from_hf.loss, from_llmc.loss);
  EXPECT_EQ(from_hf.crc, from_llmc.crc);
  EXPECT_EQ(from_hf.crc, crc32c(canonical.data(), canonical.size() * sizeof(float)));
  EXPECT_GT(from_hf.loss, 3.0);  // about ln(40): an untrained model
}

TEST_F(HfInit, ConflictingDeckKeyNamesBoth) {
  export_fixture("conflict-hf");
  try {
    eval_default_deck({"model.init=hf:" + hf, "model.n_layer=2"});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::data);
    EXPECT_NE(std::string(e.what()).find("--set model.n_layer: model.n_layer = 2 in the deck but "
                                         "n_layer = 3 in " + hf + "/config.json"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace pdtrain::test
