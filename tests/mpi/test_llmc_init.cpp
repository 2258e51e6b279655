// Starting from an llm.c checkpoint (model.init = "llmc:PATH") and `pdtrain eval`: a file holding
// exactly pdtrain's own random initialization gives the same evaluation loss, bit for bit, as
// that random initialization, on one rank and on decoupled 3D layouts; a file whose shape
// disagrees with the deck is a data error naming the field.
#include <gtest/gtest.h>
#include <mpi.h>

#include <filesystem>

#include "pdtrain/app/tools.hpp"
#include "pdtrain/ckpt/checkpoint.hpp"
#include "pdtrain/model/llmc_format.hpp"

#include <fstream>
#include <map>
#include "run_helpers.hpp"

namespace pdtrain::test {
namespace {

const char* kDeck = R"(
[run]
seed = 5
steps = 1
[model]
n_layer = 2
n_head = 2
d_model = 16
vocab_size = 40
seq_len = 8
max_seq_len = 12
[data]
copy_lag = 2
[parallel]
holders = 0
[train]
batch_size = 4
)";

std::string temp(const std::string& name) { return temp_path("llmc-" + name); }

// Writes pdtrain's initialization of the deck's model (seed 5) as an llm.c file, on rank 0.
std::string fixture() {
  static const std::string path = [] {
    const std::string p = temp("init.bin");
    if (world_rank() == 0) {
      const Deck d = parse_deck(kDeck, "t.toml", {});
      const ParamCatalog cat(resolve_model_shape(d.model));
      std::vector<float> canonical(static_cast<std::size_t>(cat.total_numel()));
      for (const BlockInfo& b : cat.blocks()) {
        std::vector<float> packed(static_cast<std::size_t>(b.numel()));
        cat.init_block(b, d.model.init_std, 5, packed.data());
        cat.scatter_block(b, packed.data(), canonical.data());
      }
      write_llmc(p, cat, canonical.data());
    }
    MPI_Barrier(MPI_COMM_WORLD);
    return p;
  }();
  return path;
}

double eval_loss(const std::vector<std::string>& sets, MPI_Comm comm) {
  Deck d = parse_deck(kDeck, "t.toml", sets);
  RunOptions o;
  o.verbose = false;
  o.eval_batches = 3;
  const TrainResult r = run_training(d, comm, o);
  const int reporter = reporting_rank(r, comm);
  EXPECT_GE(reporter, 0) << "no rank reported";
  double loss = r.reporter ? r.val_losses.at(0) : 0.0;
  if (reporter >= 0) MPI_Bcast(&loss, 1, MPI_DOUBLE, reporter, comm);
  return loss;
}

TEST(LlmcInit, FileOfOwnInitEvaluatesLikeRandomInit) {
  const std::string file = fixture();
  MPI_Comm one = group_of(MPI_COMM_WORLD, 1);
  double random_loss = 0, file_loss = 0;
  if (world_rank() == 0) {
    random_loss = eval_loss({}, one);
    file_loss = eval_loss({"model.init=llmc:" + file}, one);
  }
  if (one != MPI_COMM_NULL) MPI_Comm_free(&one);
  MPI_Bcast(&random_loss, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  MPI_Bcast(&file_loss, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  EXPECT_EQ(random_loss, file_loss);
  EXPECT_GT(random_loss, 3.0);  // about ln(40): an untrained model
  // Decoupled and tensor-parallel (3 ranks), and pipeline-parallel (3 ranks): the same model
  // from the same file, up to summation order.
  for (const char* split : {"parallel.tp=2", "parallel.pp=2"}) {
    MPI_Comm three = group_of(MPI_COMM_WORLD, 3);
    if (three == MPI_COMM_NULL) continue;
    const double pd = eval_loss({"model.init=llmc:" + file, "parallel.holders=1", split,
                                 "parallel.dp=1"},
                                three);
    MPI_Comm_free(&three);
    EXPECT_NEAR(pd, random_loss, 1e-6 * random_loss) << split;
  }
}

// llm.c -> pdtrain checkpoint -> `pdtrain export --format llmc` gives back the same bytes.
TEST(LlmcInit, ExportRoundTripIsBitIdentical) {
  const std::string file = fixture();
  if (world_rank() != 0) return;
  const Deck d = parse_deck(kDeck, "t.toml", {"model.init=llmc:" + file});
  const ParamCatalog cat(resolve_model_shape(d.model));
  std::vector<float> canonical;
  read_llmc_params(file, cat, canonical);
  std::map<int, BlockState> states;
  ckpt::BlockRefs refs;
  for (const BlockInfo& b : cat.blocks()) {
    BlockState& s = states[b.id];
    s.param.resize(static_cast<std::size_t>(b.numel()));
    cat.gather_block(b, canonical.data(), s.param.data());
    s.m.assign(s.param.size(), 0.25f);
    s.v.assign(s.param.size(), 0.5f);
    refs[b.id] = &s;
  }
  const std::string dir = temp("roundtrip");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::string ckpt_path;
  {
    ckpt::CheckpointWriter w(MPI_COMM_SELF, cat, ckpt::Codec::zstd, 1, dir, 0);
    ckpt_path = w.write(0, 0, 0, d.resolved_toml(), "test", refs);
  }
  const std::string out = temp("roundtrip.bin");
  export_llmc(ckpt_path, out);
  std::ifstream a(file, std::ios::binary), b(out, std::ios::binary);
  const std::string sa((std::istreambuf_iterator<char>(a)), {}), sb((std::istreambuf_iterator<char>(b)), {});
  EXPECT_EQ(sa.size(), sb.size());
  EXPECT_TRUE(sa == sb) << "exported file differs from the original llm.c file";
}

TEST(LlmcInit, ShapeMismatchIsADataErrorNamingTheField) {
  const std::string file = fixture();
  try {
    eval_loss({"model.init=llmc:" + file, "model.n_layer=3"}, MPI_COMM_WORLD);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::data);
    EXPECT_NE(std::string(e.what()).find("model.n_layer = 3 in the deck but num_layers = 2"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace pdtrain::test
