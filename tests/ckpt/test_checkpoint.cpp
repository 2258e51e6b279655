// Writing and reading checkpoints with one holder (MPI_COMM_WORLD of a singleton run): bit
// exact round trips per codec, other block assignments, damage detection naming the block,
// anchors, retention, find_latest_valid and inspect.
#include <gtest/gtest.h>
#include <mpi.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include "ckpt_test_util.hpp"
#include "pdtrain/core/error.hpp"

namespace fs = std::filesystem;

namespace pdtrain::ckpt::test {
namespace {

const char* kDeck = "[run]\nname = \"ckpt-test\"\n";

void expect_same_state(const State& want, const Checkpoint& got, bool params_too = true) {
  ASSERT_EQ(got.blocks.size(), want.size());
  for (const auto& [id, w] : want) {
    const BlockState& g = got.blocks.at(id);
    if (params_too) EXPECT_TRUE(same_bits(g.param, w.param)) << "params of block " << id;
    EXPECT_TRUE(same_bits(g.m, w.m)) << "m of block " << id;
    EXPECT_TRUE(same_bits(g.v, w.v)) << "v of block " << id;
    EXPECT_EQ(g.decay, w.decay) << id;
  }
}

Checkpoint read_all(const std::string& path, const ParamCatalog& cat) {
  return read_checkpoint(path, cat, MPI_COMM_WORLD, all_ids(cat));
}

// The message of the Error(data) that reading `path` throws ("" if it does not throw).
std::string read_error(const std::string& path, const ParamCatalog& cat) {
  try {
    read_all(path, cat);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::data) << e.what();
    return e.what();
  }
  return "";
}

// One checkpoint in `dir` (`codec`): random_state(cat, seed) as step `step`; returns its path.
std::string write_one(const ParamCatalog& cat, const std::string& dir, Codec codec,
                      std::uint64_t seed = 1, std::int64_t step = 1, std::int64_t tokens_seen = 0) {
  CheckpointWriter w(MPI_COMM_WORLD, cat, codec, 1, dir, 0);
  return w.write(step, step, tokens_seen, kDeck, "", refs(random_state(cat, seed)));
}

// Steps 1 and 2 of a run checkpointed in `dir` (`codec`, an anchor every `anchor_every` steps):
// random_state(cat, seed), then trained_like it (seed + 1).
struct TwoSteps {
  State s1, s2;
  std::string p1, p2;  // their files
};
TwoSteps write_two_steps(const ParamCatalog& cat, const std::string& dir, Codec codec,
                         int anchor_every, std::uint64_t seed = 1) {
  TwoSteps t;
  t.s1 = random_state(cat, seed);
  t.s2 = trained_like(t.s1, seed + 1);
  CheckpointWriter w(MPI_COMM_WORLD, cat, codec, anchor_every, dir, 0);
  t.p1 = w.write(1, 1, 0, kDeck, "", refs(t.s1));
  t.p2 = w.write(2, 2, 0, kDeck, "", refs(t.s2));
  return t;
}

class LosslessRoundTrip : public ::testing::TestWithParam<Codec> {};

TEST_P(LosslessRoundTrip, ReadsBackEveryBitOfParamsAndMoments) {
  for (const ModelShape& shape : {tiny_shape(), uneven_shape()}) {
    const ParamCatalog cat(shape);
    ScratchDir dir;
    CheckpointWriter w(MPI_COMM_WORLD, cat, GetParam(), 4, dir.path(), 0);
    const State s1 = random_state(cat, 1), s2 = trained_like(s1, 2), s3 = trained_like(s2, 3);
    const std::string p1 = w.write(10, 10, 1000, kDeck, "holders=1", refs(s1));
    const std::string p2 = w.write(20, 20, 2000, kDeck, "holders=1", refs(s2));
    const std::string p3 = w.write(30, 30, 3000, kDeck, "holders=1", refs(s3));
    EXPECT_EQ(w.last_stats().anchor, !is_delta(GetParam()));
    EXPECT_EQ(w.last_stats().codec, GetParam());
    expect_same_state(s1, read_all(p1, cat));
    expect_same_state(s2, read_all(p2, cat));
    const Checkpoint c3 = read_all(p3, cat);
    expect_same_state(s3, c3);
    EXPECT_EQ(c3.meta.step, 30);
    EXPECT_EQ(c3.meta.version, 30);
    EXPECT_EQ(c3.meta.tokens_seen, 3000);
    EXPECT_EQ(c3.meta.deck, kDeck);
    EXPECT_EQ(c3.meta.layout, "holders=1");
    EXPECT_EQ(c3.meta.codec, GetParam());
    if (is_delta(GetParam())) EXPECT_EQ(c3.meta.anchor, "ckpt-00000010.h5");
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, LosslessRoundTrip,
                         ::testing::Values(Codec::raw, Codec::zstd, Codec::xor_delta),
                         [](const auto& info) { return std::string(codec_name(info.param)); });

TEST(Checkpoint, FileHasTheDocumentedLayout) {
  const ParamCatalog cat(tiny_shape());
  ScratchDir dir;
  const std::string path = write_one(cat, dir.path(), Codec::zstd, 1, 7, 70);
  EXPECT_EQ(path, dir / "ckpt-00000007.h5");
  const CheckpointMeta m = read_meta(path);
  EXPECT_TRUE(m.complete);
  EXPECT_EQ(m.format_version, 1);
  EXPECT_EQ(m.shape.padded_vocab, 128);
  std::ifstream latest(dir / "latest");
  std::string name;
  std::getline(latest, name);
  EXPECT_EQ(name, "ckpt-00000007.h5");
  // Global shapes, chunked on the block grid.
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  const hid_t d = H5Dopen2(f, "adam_v/qkvw", H5P_DEFAULT);
  const hid_t sp = H5Dget_space(d);
  hsize_t dims[3], chunk[3];
  ASSERT_EQ(H5Sget_simple_extent_dims(sp, dims, nullptr), 3);
  EXPECT_EQ(dims[0], 2u);
  EXPECT_EQ(dims[1], 48u);
  EXPECT_EQ(dims[2], 16u);
  const hid_t dcpl = H5Dget_create_plist(d);
  ASSERT_EQ(H5Pget_chunk(dcpl, 3, chunk), 3);
  EXPECT_EQ(chunk[0], 1u);
  EXPECT_EQ(chunk[1], 4u);  // one head's q rows: 16 / 4
  EXPECT_EQ(chunk[2], 16u);
  EXPECT_EQ(H5Pget_nfilters(dcpl), 2);  // shuffle, zstd
  unsigned flags = 0, cd[4];
  size_t ncd = 4;
  EXPECT_EQ(H5Pget_filter2(dcpl, 1, &flags, &ncd, cd, 0, nullptr, nullptr), 32015);
  H5Pclose(dcpl);
  H5Sclose(sp);
  H5Dclose(d);
  H5Fclose(f);
}

// max_error/<state> of a bitdelta file: the per-block bounds inspect reports.
std::vector<float> stored_bounds(const std::string& path, const char* state, std::size_t n) {
  std::vector<float> out(n);
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  const hid_t d = H5Dopen2(f, (std::string("max_error/") + state).c_str(), H5P_DEFAULT);
  EXPECT_GE(H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()), 0) << state;
  H5Dclose(d);
  H5Fclose(f);
  return out;
}

// Every width the deck allows at its ends and its default: a bitdelta file decodes to exactly
// the quantizers' decode of the state against the lossless anchor (not against step 2), each
// block within the bounds the file states (which inspect prints per tensor), moments exact
// when moment_bits is 0.
TEST(Checkpoint, BitDeltaRoundTripsWithinTheStatedBoundsPerBlock) {
  for (const BitDeltaBits bits : {BitDeltaBits{1, 0}, BitDeltaBits{}, BitDeltaBits{8, 2}}) {
    SCOPED_TRACE("bitdelta_bits " + std::to_string(bits.params) + ", moment_bits " +
                 std::to_string(bits.moments));
    for (const ModelShape& shape : {tiny_shape(), uneven_shape()}) {
      const ParamCatalog cat(shape);
      ScratchDir dir;
      CheckpointWriter w(MPI_COMM_WORLD, cat, Codec::bitdelta, 3, dir.path(), 0, 3, bits);
      const State s0 = random_state(cat, 1), s1 = trained_like(s0, 2), s2 = trained_like(s1, 3);
      w.write(1, 1, 0, kDeck, "", refs(s0));
      EXPECT_TRUE(w.last_stats().anchor);
      w.write(2, 2, 0, kDeck, "", refs(s1));
      const std::string p2 = w.write(3, 3, 0, kDeck, "", refs(s2));
      EXPECT_EQ(w.last_stats().codec, Codec::bitdelta);
      const Checkpoint c = read_all(p2, cat);
      EXPECT_EQ(c.meta.anchor, "ckpt-00000001.h5");  // always the lossless anchor, not step 2
      EXPECT_EQ(c.meta.bits, bits);
      const Lossy want = bitdelta_of(s2, s0, bits);
      if (bits.moments == 0) expect_same_state(s2, c, /*params_too=*/false);
      const char* states[3] = {"params", "adam_m", "adam_v"};
      for (int k = 0; k < 3; ++k) {
        if (!state_quant(Codec::bitdelta, bits, k)) continue;
        const std::vector<float> bound = stored_bounds(p2, states[k], cat.blocks().size());
        for (const auto& [id, st] : s2) {
          const std::vector<float>& x = k == 0 ? st.param : k == 1 ? st.m : st.v;
          const BlockState& g = c.blocks.at(id);
          const std::vector<float>& got = k == 0 ? g.param : k == 1 ? g.m : g.v;
          const std::vector<float>& exp = k == 0   ? want.decoded.at(id).param
                                          : k == 1 ? want.decoded.at(id).m
                                                   : want.decoded.at(id).v;
          ASSERT_TRUE(same_bits(got, exp)) << states[k] << " of block " << id;
          EXPECT_EQ(bound[static_cast<std::size_t>(id)], want.bounds.at(id)[k]) << id;
          for (std::size_t i = 0; i < x.size(); ++i) {
            const double err = std::fabs(static_cast<double>(got[i]) - x[i]);
            ASSERT_LE(k == 2 && x[i] > 0 ? err / x[i] : err, bound[static_cast<std::size_t>(id)])
                << states[k] << " of block " << id << " [" << i << "]";
          }
        }
      }
      // inspect names every tensor with its bounds.
      const std::string text = inspect(p2);
      EXPECT_NE(text.find("error bounds"), std::string::npos) << text;
      for (const TensorInfo& t : cat.tensors())
        EXPECT_NE(text.find("    " + t.name + " "), std::string::npos) << t.name << "\n" << text;
    }
  }
}

// A bitdelta file of format version 1 (1 bit per weight in params_signs, before issue 16) is
// refused with a message naming the file and the anchor to restart from instead.
TEST(Checkpoint, AVersionOneBitdeltaFileIsRefusedNamingItsAnchor) {
  const ParamCatalog cat(tiny_shape());
  ScratchDir dir;
  const std::string delta = write_two_steps(cat, dir.path(), Codec::bitdelta, 2).p2;
  ASSERT_EQ(read_error(delta, cat), "");
  const hid_t f = H5Fopen(delta.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  const hid_t a = H5Aopen(f, "format_version", H5P_DEFAULT);
  const std::int64_t one = 1;
  ASSERT_GE(H5Awrite(a, H5T_NATIVE_INT64, &one), 0);
  H5Aclose(a);
  H5Fclose(f);
  const std::string msg = read_error(delta, cat);
  EXPECT_NE(msg.find(delta + ": format_version 1 of a bitdelta file is not supported"),
            std::string::npos) << msg;
  EXPECT_NE(msg.find("restart from its anchor ckpt-00000001.h5 instead"), std::string::npos) << msg;
}

TEST(Checkpoint, AnyAssignmentOfBlocksReadsTheSameBits) {
  const ParamCatalog cat(uneven_shape());
  ScratchDir dir;
  const TwoSteps run = write_two_steps(cat, dir.path(), Codec::xor_delta, 2, 4);
  // Every third block, in a scrambled order: a holder of another layout.
  std::vector<int> some;
  for (int id = static_cast<int>(cat.blocks().size()) - 1; id >= 0; id -= 3) some.push_back(id);
  const Checkpoint c = read_checkpoint(run.p2, cat, MPI_COMM_WORLD, some);
  ASSERT_EQ(c.blocks.size(), some.size());
  for (int id : some) {
    EXPECT_TRUE(same_bits(c.blocks.at(id).param, run.s2.at(id).param)) << id;
    EXPECT_TRUE(same_bits(c.blocks.at(id).v, run.s2.at(id).v)) << id;
  }
}

TEST(Checkpoint, AnotherModelShapeIsRejectedNamingBoth) {
  const ParamCatalog cat(tiny_shape());
  ScratchDir dir;
  const std::string path = write_one(cat, dir.path(), Codec::raw);
  const std::string msg = read_error(path, ParamCatalog(uneven_shape()));
  EXPECT_NE(msg.find("n_head=4"), std::string::npos) << msg;
  EXPECT_NE(msg.find("n_head=3"), std::string::npos) << msg;
}

// A flipped byte anywhere in a block's data is caught and the error names the tensor and block.
struct Damage {
  Codec codec;
  std::string dataset;  // where to flip: "params/wte", "crc32c/adam_m", "params_signs/wte"
  TensorId tensor;      // whose block
  int index;            // the index-th block of that tensor
  std::string expect;   // names the dataset in the message
};

void PrintTo(const Damage& d, std::ostream* os) {
  *os << codec_name(d.codec) << " " << d.dataset << " block " << d.index;
}

int block_of(const ParamCatalog& cat, TensorId t, int index) {
  for (const BlockInfo& b : cat.blocks())
    if (b.tensor == t && index-- == 0) return b.id;
  return -1;
}

class DamageDetection : public ::testing::TestWithParam<Damage> {};

TEST_P(DamageDetection, FlippedByteNamesTensorAndBlock) {
  const Damage& dmg = GetParam();
  const ParamCatalog cat(tiny_shape());
  ScratchDir dir;
  const TwoSteps run = write_two_steps(cat, dir.path(), dmg.codec, 2);
  const std::string path = is_delta(dmg.codec) ? run.p2 : run.p1;  // a delta, or an anchor
  ASSERT_EQ(read_error(path, cat), "");

  const int id = block_of(cat, dmg.tensor, dmg.index);
  const BlockInfo& b = cat.block(id);
  std::vector<hsize_t> coord;
  if (cat.tensor(b.tensor).per_layer) coord.push_back(static_cast<hsize_t>(b.layer));
  coord.push_back(static_cast<hsize_t>(b.row0));
  if (cat.tensor(b.tensor).cols > 1) coord.push_back(static_cast<hsize_t>(b.col0));
  if (dmg.dataset.find("_codes/") != std::string::npos)  // [blocks of the tensor, bytes]
    coord = {static_cast<hsize_t>(dmg.index), 0};
  auto [offset, size] = data_location(path, dmg.dataset, coord);
  ASSERT_GT(size, 0u) << dmg.dataset;
  if (dmg.dataset.rfind("crc32c/", 0) == 0) {  // contiguous: the block's entry
    offset += 4 * static_cast<std::uint64_t>(id);
    size = 4;
  }
  flip_byte(path, offset + size / 2);
  const std::string msg = read_error(path, cat);
  const std::string named = dmg.expect + " block " + std::to_string(id) + " " + cat.block_name(b);
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find(named), std::string::npos) << "want '" << named << "' in: " << msg;
}

INSTANTIATE_TEST_SUITE_P(
    Datasets, DamageDetection,
    ::testing::Values(
        Damage{Codec::raw, "params/wte", TensorId::wte, 2, "params/wte"},
        Damage{Codec::raw, "adam_m/qkvw", TensorId::qkvw, 13, "adam_m/qkvw"},
        Damage{Codec::raw, "adam_v/ln1w", TensorId::ln1w, 1, "adam_v/ln1w"},
        Damage{Codec::raw, "params/attprojw", TensorId::attprojw, 5, "params/attprojw"},
        Damage{Codec::raw, "crc32c/adam_m", TensorId::qkvw, 13, "adam_m/qkvw"},
        Damage{Codec::zstd, "params/qkvw", TensorId::qkvw, 7, "params/qkvw"},
        Damage{Codec::zstd, "adam_v/wte", TensorId::wte, 1, "adam_v/wte"},
        Damage{Codec::xor_delta, "params/fcprojw", TensorId::fcprojw, 6, "params/fcprojw"},
        Damage{Codec::xor_delta, "adam_m/ln2b", TensorId::ln2b, 1, "adam_m/ln2b"},
        Damage{Codec::bitdelta, "params_codes/wte", TensorId::wte, 3, "params_codes/wte"},
        Damage{Codec::bitdelta, "adam_m_codes/fcw", TensorId::fcw, 2, "adam_m_codes/fcw"},
        Damage{Codec::bitdelta, "adam_v_codes/qkvw", TensorId::qkvw, 7, "adam_v_codes/qkvw"},
        Damage{Codec::bitdelta, "crc32c/adam_v", TensorId::attprojw, 1, "adam_v_codes/attprojw"}),
    [](const auto& info) {
      return std::string(codec_name(info.param.codec)) + "_" + std::to_string(info.index);
    });

TEST(Checkpoint, DeltaNamesAMissingOrForeignAnchor) {
  const ParamCatalog cat(tiny_shape());
  ScratchDir dir;
  const std::string delta = write_two_steps(cat, dir.path(), Codec::xor_delta, 5).p2;
  // Another run's step-1 anchor in its place: same name, other parameters.
  ScratchDir other;
  write_one(cat, other.path(), Codec::zstd, 99);
  fs::copy_file(other / "ckpt-00000001.h5", dir / "ckpt-00000001.h5",
                fs::copy_options::overwrite_existing);
  std::string msg = read_error(delta, cat);
  EXPECT_NE(msg.find("anchor"), std::string::npos) << msg;
  EXPECT_NE(msg.find("params_crc32c"), std::string::npos) << msg;
  fs::remove(dir / "ckpt-00000001.h5");
  msg = read_error(delta, cat);
  EXPECT_NE(msg.find("ckpt-00000001.h5 is missing"), std::string::npos) << msg;
}

std::set<std::string> files_in(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

TEST(Retention, KeepsTheNewestAndTheAnchorsTheyNeed) {
  const ParamCatalog cat(tiny_shape());
  ScratchDir dir;
  CheckpointWriter w(MPI_COMM_WORLD, cat, Codec::xor_delta, 3, dir.path(), 2);
  State s = random_state(cat, 1);
  auto name = [](int step) { return checkpoint_file_name(step); };
  for (int step = 1; step <= 7; ++step) {  // anchors at 1, 4, 7
    s = trained_like(s, static_cast<std::uint64_t>(step));
    w.write(step, step, 0, kDeck, "", refs(s));
    EXPECT_EQ(w.last_stats().anchor, step == 1 || step == 4 || step == 7) << step;
    if (step == 3) EXPECT_EQ(files_in(dir.path()), (std::set<std::string>{name(1), name(2), name(3), "latest"}));
    if (step == 5) EXPECT_EQ(files_in(dir.path()), (std::set<std::string>{name(4), name(5), "latest"}));
    if (step == 6) EXPECT_EQ(files_in(dir.path()), (std::set<std::string>{name(4), name(5), name(6), "latest"}));
    if (step == 7) EXPECT_EQ(files_in(dir.path()), (std::set<std::string>{name(4), name(6), name(7), "latest"}));
  }
  // Every kept checkpoint still decodes.
  for (int step : {6, 7}) EXPECT_EQ(read_error(dir / name(step), cat), "") << step;
}

TEST(Retention, NeverDeletesACheckpointThatDoesNotVerify) {
  const ParamCatalog cat(tiny_shape());
  // An earlier job's xor anchor (step 1) and its delta (step 2), the anchor's parameters then
  // damaged on disk: neither verifies. Copied, so that this process has not written them.
  ScratchDir before, dir;
  write_two_steps(cat, before.path(), Codec::xor_delta, 3);
  for (int step : {1, 2})
    fs::copy_file(before / checkpoint_file_name(step), dir / checkpoint_file_name(step));
  auto [off, size] = data_location(dir / checkpoint_file_name(1), "params/wte", {0, 0});
  flip_byte(dir / checkpoint_file_name(1), off + size / 2);
  ASSERT_NE(read_error(dir / checkpoint_file_name(2), cat), "");
  // This job keeps one checkpoint (anchors at 3 and 6): the good 3, 4, 5 go, the damaged stay.
  CheckpointWriter w(MPI_COMM_WORLD, cat, Codec::xor_delta, 3, dir.path(), 1);
  State s = random_state(cat, 9);
  for (int step = 3; step <= 6; ++step) {
    s = trained_like(s, static_cast<std::uint64_t>(step));
    w.write(step, step, 0, kDeck, "", refs(s));
  }
  EXPECT_EQ(files_in(dir.path()),
            (std::set<std::string>{checkpoint_file_name(1), checkpoint_file_name(2),
                                   checkpoint_file_name(6), "latest"}));
}

TEST(Latest, SkipsADamagedNewestCheckpointWithAWarning) {
  const ParamCatalog cat(tiny_shape());
  ScratchDir dir;
  const std::string p2 = write_two_steps(cat, dir.path(), Codec::zstd, 1).p2;
  EXPECT_EQ(find_latest_valid(dir.path()).path, p2);
  // Damage one block's chunk of the newest.
  const BlockInfo& b = cat.block(block_of(cat, TensorId::qkvw, 0));
  auto [off, size] = data_location(p2, "adam_m/qkvw", {static_cast<hsize_t>(b.layer),
                                                       static_cast<hsize_t>(b.row0), 0});
  flip_byte(p2, off + size / 2);
  const LatestValid l = find_latest_valid(dir.path());
  EXPECT_EQ(l.path, dir / "ckpt-00000001.h5");
  ASSERT_EQ(l.warnings.size(), 1u);
  EXPECT_NE(l.warnings[0].find("ckpt-00000002.h5"), std::string::npos) << l.warnings[0];
  EXPECT_NE(l.warnings[0].find("adam_m/qkvw block " + std::to_string(b.id)), std::string::npos)
      << l.warnings[0];
  // Without the data check the damage goes unseen: that mode trusts the complete flag only.
  EXPECT_EQ(find_latest_valid(dir.path(), false).path, p2);
  // A truncated file does not even open.
  fs::resize_file(p2, fs::file_size(p2) / 2);
  EXPECT_EQ(find_latest_valid(dir.path(), false).path, dir / "ckpt-00000001.h5");
}

TEST(Latest, SkipsACheckpointHoldingADivergedState) {
  // What an older pdtrain wrote after the loss overflowed: CRCs right, a value NaN.
  const ParamCatalog cat(tiny_shape());
  ScratchDir dir;
  State s = random_state(cat, 3);
  CheckpointWriter w(MPI_COMM_WORLD, cat, Codec::raw, 1, dir.path(), 0);
  const std::string good = w.write(1, 1, 0, kDeck, "", refs(s));
  s.at(2).v[5] = std::numeric_limits<float>::quiet_NaN();
  w.write(2, 2, 0, kDeck, "", refs(s));
  const LatestValid l = find_latest_valid(dir.path());
  EXPECT_EQ(l.path, good);
  ASSERT_EQ(l.warnings.size(), 1u);
  EXPECT_NE(l.warnings[0].find("ckpt-00000002.h5 does not verify: block " + cat.block_name(cat.block(2)) +
                               " holds a value that is not finite"),
            std::string::npos)
      << l.warnings[0];
}

TEST(Checkpoint, WithoutTheCompleteFlagAFileIsRejected) {
  const ParamCatalog cat(tiny_shape());
  ScratchDir dir;
  const std::string path = write_one(cat, dir.path(), Codec::raw);
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(H5Adelete(f, "complete"), 0);
  H5Fclose(f);
  EXPECT_NE(read_error(path, cat).find("incomplete"), std::string::npos);
  EXPECT_EQ(find_latest_valid(dir.path()).path, "");
}

TEST(Inspect, DescribesTheFileAndReportsDamagedBlocks) {
  const ParamCatalog cat(tiny_shape());
  ScratchDir dir;
  const std::string path = write_two_steps(cat, dir.path(), Codec::xor_delta, 2).p2;
  std::string text = inspect(path);
  const std::string n = std::to_string(cat.blocks().size());
  for (const std::string& want : {std::string("step 2"), std::string("codec xor"),
                                  std::string("anchor ckpt-00000001.h5"), std::string("params/qkvw"),
                                  std::string("[2, 48, 16]"), std::string("adam_v/lnfb"),
                                  "all " + n + " blocks verify"})
    EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
  auto [off, size] = data_location(path, "params/wte", {0, 0});
  flip_byte(path, off + size / 2);
  text = inspect(path);
  EXPECT_NE(text.find("1 of " + n + " blocks DAMAGED"), std::string::npos) << text;
  EXPECT_NE(text.find("params/wte block 0"), std::string::npos) << text;
}

}  // namespace
}  // namespace pdtrain::ckpt::test
