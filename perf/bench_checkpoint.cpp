// Checkpoint codecs on a real run's state: compression ratio against raw fp32 for each codec,
// the same bytes through plain zstd, random-normal fp32 as a sanity row, and write/read
// throughput against an uncompressed (raw) HDF5 write of the same bytes, all in one run.
//
//   bench_checkpoint ANCHOR.h5 LATER.h5     e.g. the step-100 and step-200 checkpoints of
//                                            perf/decks/shakespeare_6l.toml
//   bench_checkpoint --short                 a tiny synthetic state (CI: the arithmetic only)
#include <mpi.h>
#include <zstd.h>

#include <Kokkos_Core.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>

#include "pdtrain/ckpt/checkpoint.hpp"
#include "pdtrain/core/rng.hpp"

namespace fs = std::filesystem;
using namespace pdtrain;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

ckpt::BlockRefs refs(const std::map<int, BlockState>& s) {
  ckpt::BlockRefs r;
  for (const auto& [id, b] : s) r[id] = &b;
  return r;
}

std::int64_t raw_bytes(const std::map<int, BlockState>& s) {
  std::int64_t n = 0;
  for (const auto& [id, b] : s) n += 3 * static_cast<std::int64_t>(b.param.size()) * 4;
  return n;
}

struct Row {
  double ratio, write_s, read_s;
};

// Writes `anchor` then `later` with `codec` (so deltas are against the anchor), and reads
// `later` back; returns later's ratio and times.
Row measure(const ParamCatalog& cat, ckpt::Codec codec, const std::map<int, BlockState>& anchor,
            const std::map<int, BlockState>& later, const std::string& dir) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  ckpt::CheckpointWriter w(MPI_COMM_SELF, cat, codec, 1000, dir, 0);
  w.write(1, 1, 0, "", "bench", refs(anchor));
  const auto t0 = std::chrono::steady_clock::now();
  const std::string path = w.write(2, 2, 0, "", "bench", refs(later));
  const double write_s = seconds_since(t0);
  std::vector<int> ids;
  for (const auto& [id, b] : later) ids.push_back(id);
  const auto t1 = std::chrono::steady_clock::now();
  ckpt::read_checkpoint(path, cat, MPI_COMM_SELF, ids);
  const double read_s = seconds_since(t1);
  return {static_cast<double>(raw_bytes(later)) / static_cast<double>(fs::file_size(path)), write_s,
          read_s};
}

double plain_zstd_ratio(const std::map<int, BlockState>& s) {
  std::vector<float> all;
  for (const auto& [id, b] : s) {
    all.insert(all.end(), b.param.begin(), b.param.end());
    all.insert(all.end(), b.m.begin(), b.m.end());
    all.insert(all.end(), b.v.begin(), b.v.end());
  }
  std::vector<char> out(ZSTD_compressBound(all.size() * 4));
  const std::size_t n = ZSTD_compress(out.data(), out.size(), all.data(), all.size() * 4, 3);
  return static_cast<double>(all.size() * 4) / static_cast<double>(n);
}

std::map<int, BlockState> random_state(const ParamCatalog& cat, std::uint64_t seed) {
  std::map<int, BlockState> s;
  for (const BlockInfo& b : cat.blocks()) {
    BlockState& x = s[b.id];
    for (auto* v : {&x.param, &x.m, &x.v}) {
      v->resize(static_cast<std::size_t>(b.numel()));
      for (std::size_t i = 0; i < v->size(); ++i) {
        const double r = 0.02 * rng_normal(rng_key(seed, b.id, v == &x.m), i);
        // A second moment is an average of squares: never negative (bitdelta relies on it).
        (*v)[i] = static_cast<float>(v == &x.v ? std::abs(r) : r);
      }
    }
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  Kokkos::initialize(argc, argv);
  int rc = 0;
  {
    const bool short_mode = argc > 1 && std::string(argv[1]) == "--short";
    if (!short_mode && argc < 3) {
      std::fprintf(stderr, "usage: bench_checkpoint ANCHOR.h5 LATER.h5 | --short\n");
      rc = 2;
    } else {
      std::map<int, BlockState> anchor, later;
      ModelShape shape{};
      if (short_mode) {
        ModelConfig m;
        m.n_layer = 2, m.n_head = 2, m.d_model = 32, m.vocab_size = 64, m.seq_len = 16;
        shape = resolve_model_shape(m);
      } else {
        shape = ckpt::read_meta(argv[1]).shape;
        shape.seq_len = shape.max_seq_len;
      }
      const ParamCatalog cat(shape);
      if (short_mode) {
        anchor = random_state(cat, 1);
        later = anchor;  // a small step away from the anchor
        for (auto& [id, b] : later)
          for (std::size_t i = 0; i < b.param.size(); ++i) b.param[i] += 1e-4f * static_cast<float>(i % 7);
      } else {
        std::vector<int> ids;
        for (const BlockInfo& b : cat.blocks()) ids.push_back(b.id);
        anchor = ckpt::read_checkpoint(argv[1], cat, MPI_COMM_SELF, ids).blocks;
        later = ckpt::read_checkpoint(argv[2], cat, MPI_COMM_SELF, ids).blocks;
      }
      const std::string dir = (fs::temp_directory_path() / "pdtrain-bench-ckpt").string();
      const double mib = static_cast<double>(raw_bytes(later)) / 1048576.0;
      std::printf("state: %lld parameters, %.1f MiB of params + Adam m + v (fp32)\n",
                  static_cast<long long>(cat.total_numel()), mib);
      const Row raw = measure(cat, ckpt::Codec::raw, anchor, later, dir);
      for (ckpt::Codec c : {ckpt::Codec::raw, ckpt::Codec::zstd, ckpt::Codec::xor_delta,
                            ckpt::Codec::bitdelta}) {
        const Row r = c == ckpt::Codec::raw ? raw : measure(cat, c, anchor, later, dir);
        std::printf("ratio codec=%-8s whole_file=%.3f write=%.0f MiB/s (%.2fx raw) "
                    "read=%.0f MiB/s (%.2fx raw)\n",
                    ckpt::codec_name(c), r.ratio, mib / r.write_s, raw.write_s / r.write_s,
                    mib / r.read_s, raw.read_s / r.read_s);
        // HDF5's own metadata dominates a tiny file; a real state is never much bigger than raw.
        if (!(r.ratio > (short_mode ? 0.3 : 0.9))) rc = 1;
      }
      std::printf("ratio plain_zstd_of_same_bytes=%.3f\n", plain_zstd_ratio(later));
      const auto noise = random_state(cat, 99);
      const Row rn = measure(cat, ckpt::Codec::zstd, noise, noise, dir);
      std::printf("ratio random_normal_fp32_zstd=%.3f (expected ~1.0-1.1)\n", rn.ratio);
      if (!short_mode && !(rn.ratio > 0.9 && rn.ratio < 1.3)) rc = 1;
      fs::remove_all(dir);
    }
  }
  Kokkos::finalize();
  MPI_Finalize();
  return rc;
}
