// The asynchronous writer, a writer killed in the middle of a checkpoint, h5dump through the
// zstd plugin, and the compression the codecs reach (printed for the report).
#include <gtest/gtest.h>
#include <mpi.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "ckpt_test_util.hpp"
#include "pdtrain/ckpt/zstd_filter.hpp"
#include "pdtrain/core/error.hpp"
#include "pdtrain/core/test_hooks.hpp"
#include "pdtrain/optim/adamw.hpp"

namespace fs = std::filesystem;

namespace pdtrain::ckpt::test {
namespace {

const char* kDeck = "[run]\nname = \"ckpt-test\"\n";

TEST(Async, WritesTheSnapshotNotTheStateThatMovedOn) {
  const ParamCatalog cat(tiny_shape());
  ScratchDir dir;
  CheckpointWriter w(MPI_COMM_WORLD, cat, Codec::xor_delta, 3, dir.path(), 0);
  State s = random_state(cat, 1);
  const State s0 = s;
  const std::string p1 = w.write_async(1, 1, 10, kDeck, "", refs(s));
  EXPECT_TRUE(w.pending());
  s = trained_like(s, 2);  // training goes on while the checkpoint is encoded
  const State s1 = s;
  while (!w.poll()) {
  }
  EXPECT_FALSE(w.pending());
  // The xor delta: made in the background against the anchor committed above.
  const std::string p2 = w.write_async(2, 2, 20, kDeck, "", refs(s));
  s = trained_like(s, 3);
  w.wait();
  const WriteStats& st = w.last_stats();
  EXPECT_EQ(st.path, p2);
  EXPECT_EQ(st.codec, Codec::xor_delta);
  // Chunks that are exactly one block were compressed in the background; only the chunks
  // that straddle two of wpe's unequal blocks were compressed during the commit.
  // wpe (10 rows, 4 heads) has blocks of rows [0,2) [2,5) [5,7) [7,10) and chunks of 3 rows:
  // none of its 4 chunks per dataset is one whole block.
  const std::int64_t whole = 3 * (static_cast<std::int64_t>(cat.blocks().size()) - 4);
  EXPECT_EQ(st.precompressed_chunks, whole) << "background compression unused";
  EXPECT_EQ(st.commit_compressed_chunks, 3 * 4);
  const Checkpoint c1 = read_checkpoint(p1, cat, MPI_COMM_WORLD, all_ids(cat));
  const Checkpoint c2 = read_checkpoint(p2, cat, MPI_COMM_WORLD, all_ids(cat));
  for (const auto& [id, b] : s0) EXPECT_TRUE(same_bits(c1.blocks.at(id).param, b.param)) << id;
  for (const auto& [id, b] : s1) {
    EXPECT_TRUE(same_bits(c2.blocks.at(id).param, b.param)) << id;
    EXPECT_TRUE(same_bits(c2.blocks.at(id).m, b.m)) << id;
  }
}

TEST(Async, ADestroyedWriterFinishesItsPendingCheckpoint) {
  const ParamCatalog cat(tiny_shape());
  ScratchDir dir;
  const State s = random_state(cat, 1);
  std::string path;
  {
    CheckpointWriter w(MPI_COMM_WORLD, cat, Codec::zstd, 1, dir.path(), 0);
    path = w.write_async(5, 5, 0, kDeck, "", refs(s));
  }
  EXPECT_TRUE(read_meta(path).complete);
}

// Forks a child that writes checkpoint 2 and dies (_exit) at `point`; returns its exit status.
int kill_writer_at(CheckpointWriter& w, const State& s, const std::string& point) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    // The child: one holder writes through the POSIX driver and makes no MPI call that
    // communicates, so it can run here.
    test_hooks::set_checkpoint_write_hook([point](std::string_view p) {
      if (p == point) ::_exit(42);
    });
    try {
      w.write(2, 2, 0, kDeck, "", refs(s));
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(0);  // the hook never fired
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(Crash, AWriterKilledMidWriteLeavesThePreviousCheckpointLoadable) {
  const ParamCatalog cat(tiny_shape());
  for (const char* point : {"params_written", "before_complete", "before_rename"}) {
    ScratchDir dir;
    CheckpointWriter w(MPI_COMM_WORLD, cat, Codec::zstd, 1, dir.path(), 2);
    const State s1 = random_state(cat, 1), s2 = trained_like(s1, 2);
    const std::string p1 = w.write(1, 1, 0, kDeck, "", refs(s1));
    ASSERT_EQ(kill_writer_at(w, s2, point), 42) << point;
    EXPECT_TRUE(fs::exists(dir / "ckpt-00000002.h5.tmp")) << point;  // the half-written file
    EXPECT_FALSE(fs::exists(dir / "ckpt-00000002.h5")) << point;
    std::ifstream latest(dir / "latest");
    std::string name;
    std::getline(latest, name);
    EXPECT_EQ(name, "ckpt-00000001.h5") << point;
    const LatestValid l = find_latest_valid(dir.path());
    EXPECT_EQ(l.path, p1) << point;
    const Checkpoint c = read_checkpoint(l.path, cat, MPI_COMM_WORLD, all_ids(cat));
    for (const auto& [id, b] : s1) ASSERT_TRUE(same_bits(c.blocks.at(id).v, b.v)) << id;
    // The next successful write clears the leftover.
    w.write(3, 3, 0, kDeck, "", refs(s2));
    EXPECT_FALSE(fs::exists(dir / "ckpt-00000002.h5.tmp")) << point;
  }
}

// h5dump (serial HDF5, no pdtrain code) decodes a zstd checkpoint through the plugin, and
// cannot without it.
TEST(Plugin, H5dumpDecodesZstdCheckpointsThroughThePlugin) {
  if (std::system("command -v h5dump > /dev/null 2>&1") != 0) GTEST_SKIP() << "no h5dump";
  ASSERT_NE(std::string(built_plugin_dir()), "");
  ASSERT_TRUE(fs::exists(std::string(built_plugin_dir()) + "/libpdtrain_h5zstd.so"));
  const ParamCatalog cat(tiny_shape());
  ScratchDir dir;
  CheckpointWriter w(MPI_COMM_WORLD, cat, Codec::zstd, 1, dir.path(), 0);
  State s = random_state(cat, 1);
  s.at(cat.blocks().size() - 2).param.assign(16, 1.25f);  // lnfw, the second-to-last block
  const std::string path = w.write(1, 1, 0, kDeck, "", refs(s));
  auto dump = [&](const std::string& plugin_dir) {
    const std::string out = dir / "dump.txt";
    const std::string cmd = "HDF5_PLUGIN_PATH=" + plugin_dir + " h5dump -d /params/lnfw " + path +
                            " > " + out + " 2>&1";
    const int rc = std::system(cmd.c_str());
    std::ifstream in(out);
    return std::make_pair(rc, std::string(std::istreambuf_iterator<char>(in), {}));
  };
  const auto [rc, text] = dump(built_plugin_dir());
  EXPECT_EQ(rc, 0) << text;
  EXPECT_NE(text.find("1.25, 1.25, 1.25"), std::string::npos) << text;
  const auto [rc2, text2] = dump(dir.path());  // no plugin there
  EXPECT_EQ(text2.find("1.25, 1.25"), std::string::npos) << text2;
}

// `steps` AdamW steps with gradients that are half persistent, half noise.
void adamw_steps(State& s, int first_step, int steps) {
  AdamWConfig c;
  c.lr = 3e-4;
  c.weight_decay = 0.1;
  for (int k = 0; k < steps; ++k) {
    const int step = first_step + k;
    for (auto& [id, st] : s) {
      std::vector<float> g(st.param.size());
      for (std::size_t i = 0; i < g.size(); ++i) {
        const std::uint64_t c0 = static_cast<std::uint64_t>(id) * 1000003ull + i;
        g[i] = static_cast<float>(1e-2 * (rng_normal(rng_key(5), c0) + rng_normal(rng_key(6, step), c0)));
      }
      adamw_update(c, step, c.lr, 1.0f, g.data(), st);
    }
  }
}

struct Ratios {
  double file, params;
};

// raw bytes / stored bytes of the second of two checkpoints (anchor a, then b).
Ratios ratios(const ParamCatalog& cat, Codec codec, const State& a, const State& b,
              BitDeltaBits bits = {}) {
  ScratchDir dir;
  CheckpointWriter w(MPI_COMM_WORLD, cat, codec, 2, dir.path(), 0, 3, bits);
  w.write(1, 1, 0, kDeck, "", refs(a));
  const std::string path = w.write(2, 2, 0, kDeck, "", refs(b));
  std::int64_t stored = 0;  // the params alone (bitdelta: codes and scales)
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  for (const std::string group : {"params", "params_codes", "params_scales"}) {
    if (H5Lexists(f, group.c_str(), H5P_DEFAULT) <= 0) continue;
    for (const TensorInfo& t : cat.tensors()) {
      const hid_t d = H5Dopen2(f, (group + "/" + t.name).c_str(), H5P_DEFAULT);
      stored += static_cast<std::int64_t>(H5Dget_storage_size(d));
      H5Dclose(d);
    }
  }
  H5Fclose(f);
  return {static_cast<double>(w.last_stats().raw_bytes) / static_cast<double>(w.last_stats().file_bytes),
          static_cast<double>(cat.total_numel() * 4) / static_cast<double>(stored)};
}

// Checks directions, and prints the numbers for the record: random fp32 data, and the delta
// of 10 AdamW steps (lr 3e-4) after 10 warm-up steps.
TEST(Compression, RatiosOnRandomDataAndOnTrainedLikeDeltas) {
  const ParamCatalog cat(resolve_model_shape(
      {.n_layer = 2, .n_head = 4, .d_model = 96, .vocab_size = 1024, .seq_len = 64}));
  State a = random_state(cat, 1);
  for (auto& [id, st] : a) st.m.assign(st.m.size(), 0.0f), st.v.assign(st.v.size(), 0.0f);
  adamw_steps(a, 1, 10);
  State b = a;
  adamw_steps(b, 11, 10);
  const Ratios raw = ratios(cat, Codec::raw, a, b);
  const Ratios zstd = ratios(cat, Codec::zstd, a, b);
  const Ratios x = ratios(cat, Codec::xor_delta, a, b);
  const Ratios bd1 = ratios(cat, Codec::bitdelta, a, b, {.params = 1, .moments = 0});
  const Ratios bd = ratios(cat, Codec::bitdelta, a, b);  // the deck's default widths
  std::printf("[ ratios ] %lld params, raw fp32 bytes / stored bytes (whole file | params only):\n"
              "[ ratios ]   raw %.3f | %.3f, zstd %.3f | %.3f, xor %.3f | %.3f\n"
              "[ ratios ]   bitdelta 1 bit, moments xor %.3f | %.2f; bitdelta %d/%d bits %.3f | %.2f\n",
              static_cast<long long>(cat.total_numel()), raw.file, raw.params, zstd.file,
              zstd.params, x.file, x.params, bd1.file, bd1.params, BitDeltaBits{}.params,
              BitDeltaBits{}.moments, bd.file, bd.params);
  EXPECT_LT(raw.file, 1.01);
  EXPECT_GT(zstd.params, 1.0);        // random fp32: only the exponent byte compresses
  EXPECT_GT(x.params, zstd.params);   // small deltas leave sign and exponent bits alike
  EXPECT_GT(bd1.params, 20.0);        // one bit per weight plus a scale pair per 256
  EXPECT_GT(bd.params, 5.0);          // 4 bits per weight plus a scale pair per 256
  EXPECT_GT(bd.file, 3.0);            // m and v quantized too (HDF5's metadata weighs here)
  EXPECT_GT(bd.file, 2 * bd1.file);
}

}  // namespace
}  // namespace pdtrain::ckpt::test
