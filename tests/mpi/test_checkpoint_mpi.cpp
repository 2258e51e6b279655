// Checkpoints written by 3 holders through parallel HDF5 (collective filtered writes, blocks
// scattered round-robin so chunks of unequal blocks are shared between holders), read back by
// 3 holders with another assignment, by 2 and by 1 (restart on another layout), bit for bit.
// Run with 3 ranks: pdtrain_mpi_test(test_checkpoint_mpi 3).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <filesystem>

#include "../ckpt/ckpt_test_util.hpp"
#include "pdtrain/ckpt/canonical_crc.hpp"
#include "pdtrain/core/crc32c.hpp"
#include "pdtrain/core/error.hpp"

namespace pdtrain::ckpt::test {
namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// A scratch directory made by rank 0 and known to all; removed by rank 0 at the end.
class SharedDir {
 public:
  SharedDir() {
    char buf[256] = {0};
    if (world_rank() == 0) {
      char tmpl[] = "/tmp/pdtrain-ckpt-mpi-XXXXXX";
      std::strncpy(buf, ::mkdtemp(tmpl), sizeof buf - 1);
    }
    MPI_Bcast(buf, sizeof buf, MPI_CHAR, 0, MPI_COMM_WORLD);
    path_ = buf;
  }
  ~SharedDir() {
    MPI_Barrier(MPI_COMM_WORLD);
    std::error_code ec;
    if (world_rank() == 0) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Holder h of n: blocks id % n == h (scattered) or a contiguous range (like place_blocks).
std::vector<int> blocks_of(const ParamCatalog& cat, int h, int n, bool scattered) {
  std::vector<int> ids;
  const int nb = static_cast<int>(cat.blocks().size());
  for (int id = 0; id < nb; ++id)
    if (scattered ? id % n == h : id * n / nb == h) ids.push_back(id);
  return ids;
}

State subset(const State& s, const std::vector<int>& ids) {
  State out;
  for (int id : ids) out[id] = s.at(id);
  return out;
}

// Every rank < n joins a communicator of n holders; the others get MPI_COMM_NULL.
MPI_Comm first_holders(int n) {
  MPI_Comm c = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() < n ? 0 : MPI_UNDEFINED, world_rank(), &c);
  return c;
}

// Reads `path` with n holders (contiguous assignment) and checks every block against `want`
// (params compared only when `params`).
void expect_read_back(const std::string& path, const ParamCatalog& cat, int n, const State& want,
                      bool params) {
  MPI_Comm comm = first_holders(n);
  if (comm == MPI_COMM_NULL) return;
  int h = 0;
  MPI_Comm_rank(comm, &h);
  const std::vector<int> ids = blocks_of(cat, h, n, false);
  const Checkpoint c = read_checkpoint(path, cat, comm, ids);
  ASSERT_EQ(c.blocks.size(), ids.size());
  for (int id : ids) {
    const BlockState& got = c.blocks.at(id);
    if (params) EXPECT_TRUE(same_bits(got.param, want.at(id).param)) << n << " holders, block " << id;
    EXPECT_TRUE(same_bits(got.m, want.at(id).m)) << n << " holders, block " << id;
    EXPECT_TRUE(same_bits(got.v, want.at(id).v)) << n << " holders, block " << id;
  }
  MPI_Comm_free(&comm);
}

std::uint32_t canonical_crc(const ParamCatalog& cat, const State& s) {
  std::vector<float> canonical(static_cast<std::size_t>(cat.total_numel()));
  for (const auto& [id, b] : s) cat.scatter_block(cat.block(id), b.param.data(), canonical.data());
  return crc32c(canonical.data(), canonical.size() * 4);
}

class ThreeHolders : public ::testing::TestWithParam<std::tuple<Codec, bool>> {};

TEST_P(ThreeHolders, WriteWithThreeReadWithThreeTwoAndOne) {
  const auto [codec, async] = GetParam();
  int n_world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n_world);
  ASSERT_EQ(n_world, 3);
  const ParamCatalog cat(uneven_shape());
  SharedDir dir;
  const State s0 = random_state(cat, 1), s1 = trained_like(s0, 2);
  const std::vector<int> mine = blocks_of(cat, world_rank(), 3, true);
  const State my0 = subset(s0, mine), my1 = subset(s1, mine);
  std::string p0, p1;
  {
    CheckpointWriter w(MPI_COMM_WORLD, cat, codec, 2, dir.path(), 0);
    if (async) {
      p0 = w.write_async(100, 100, 5, "deck", "3 holders", refs(my0));
      while (!w.poll()) {
      }
      p1 = w.write_async(200, 200, 10, "deck", "3 holders", refs(my1));
      w.wait();
      if (codec != Codec::raw) EXPECT_GT(w.last_stats().precompressed_chunks, 0);
    } else {
      p0 = w.write(100, 100, 5, "deck", "3 holders", refs(my0));
      p1 = w.write(200, 200, 10, "deck", "3 holders", refs(my1));
    }
    EXPECT_EQ(w.last_stats().codec, codec);
  }
  const CheckpointMeta m0 = read_meta(p0);
  EXPECT_TRUE(m0.complete);
  EXPECT_EQ(m0.params_crc32c, canonical_crc(cat, s0));  // the run's params_crc32c line

  // Lossless codecs give back s1 exactly; bitdelta gives back its decode of s1.
  const State want = codec == Codec::bitdelta ? bitdelta_of(s1, s0, BitDeltaBits{}).decoded : s1;
  EXPECT_EQ(read_meta(p1).params_crc32c, canonical_crc(cat, want));
  for (int n : {3, 2, 1}) {
    expect_read_back(p0, cat, n, s0, true);
    expect_read_back(p1, cat, n, want, true);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Codecs, ThreeHolders,
    ::testing::Combine(::testing::Values(Codec::raw, Codec::zstd, Codec::xor_delta, Codec::bitdelta),
                       ::testing::Bool()),
    [](const auto& info) {
      return std::string(codec_name(std::get<0>(info.param))) +
             (std::get<1>(info.param) ? "_async" : "_sync");
    });

TEST(ThreeHoldersDamage, EveryHolderReportsTheSameDamagedBlock) {
  const ParamCatalog cat(tiny_shape());
  SharedDir dir;
  const State s = random_state(cat, 3);
  const std::vector<int> mine = blocks_of(cat, world_rank(), 3, false);
  std::string path;
  {
    CheckpointWriter w(MPI_COMM_WORLD, cat, Codec::zstd, 1, dir.path(), 0);
    path = w.write(1, 1, 0, "deck", "", refs(subset(s, mine)));
  }
  int target = -1;
  for (const BlockInfo& b : cat.blocks())
    if (b.tensor == TensorId::fcw && b.layer == 1) {
      target = b.id;
      break;
    }
  if (world_rank() == 0) {
    const BlockInfo& b = cat.block(target);
    auto [off, size] = data_location(path, "adam_v/fcw", {1, static_cast<hsize_t>(b.row0), 0});
    flip_byte(path, off + size / 2);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  std::string msg;
  try {
    read_checkpoint(path, cat, MPI_COMM_WORLD, mine);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::data);
    msg = e.what();
  }
  EXPECT_NE(msg.find("adam_v/fcw block " + std::to_string(target)), std::string::npos)
      << "rank " << world_rank() << ": " << msg;
}

}  // namespace
}  // namespace pdtrain::ckpt::test
