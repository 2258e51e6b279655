// The PD fetch layer's bandwidth against raw MPI, on two ranks (a holder and a compute rank):
// the compute rank fetches one GPT-2 124M layer's blocks (checked: id, version, CRC32C, and
// unpacked into a stage buffer) again and again, per wire codec, and then the same bytes go
// through a bare MPI request/reply ping-pong. Prints bytes on the wire, time per fetch and the
// ratio fetch bandwidth / MPI bandwidth (target >= 0.8 for raw).
//   mpirun -np 2 perf/bench_fetch [--short]
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "pdtrain/core/mpi_check.hpp"
#include "pdtrain/core/timer.hpp"
#include "pdtrain/deck/deck.hpp"
#include "pdtrain/layout/layout.hpp"
#include "pdtrain/model/catalog.hpp"
#include "pdtrain/pd/holder_server.hpp"
#include "pdtrain/pd/fetch_client.hpp"

namespace {

using namespace pdtrain;

struct Model {
  explicit Model(bool small) {
    ModelConfig m;
    m.n_layer = small ? 2 : 12;
    m.n_head = small ? 4 : 12;
    m.d_model = small ? 128 : 768;
    m.vocab_size = small ? 256 : 50257;
    m.seq_len = 256;
    cat = std::make_unique<ParamCatalog>(resolve_model_shape(m));
    for (const BlockInfo& b : cat->blocks())
      table.blocks.push_back(BlockDesc{b.numel(), cat->tensor(b.tensor).weight_decay,
                                       cat->block_name(b)});
    table.init = [this](int id, float* out) { cat->init_block(cat->block(id), 0.02, 1, out); };
    table.canonical_crc = [](const std::vector<const float*>&) { return 0u; };
    for (const BlockInfo& b : cat->blocks())
      if (b.layer == 0) layer0.push_back(b.id), layer_bytes += b.bytes();
  }
  std::unique_ptr<ParamCatalog> cat;
  BlockTable table;
  std::vector<int> layer0;
  std::int64_t layer_bytes = 0;
};

// One codec: the holder serves, the compute rank fetches `reps` times after a warm-up; returns
// seconds per fetch and wire bytes per fetch (compute rank).
std::pair<double, double> time_fetches(const Model& m, const Layout& layout, WireCodec codec,
                                       int reps) {
  const std::vector<int> owner(m.table.blocks.size(), 0);
  if (layout.is_holder()) {
    HolderServer server(layout, m.table, owner, std::vector<int>(owner.size(), 1), AdamWConfig{},
                        codec, WireCodec::raw, 0, nullptr);
    server.run();
    return {0.0, 0.0};
  }
  FetchClient client(layout, m.table, owner, codec, WireCodec::raw);
  std::vector<float> stage(static_cast<std::size_t>(m.layer_bytes / 4));
  std::vector<std::size_t> at(m.table.blocks.size(), 0);
  std::size_t off = 0;
  for (int b : m.layer0) at[b] = off, off += static_cast<std::size_t>(m.table.blocks[b].numel);
  auto sink = [&](int b, const float* d) {
    std::memcpy(stage.data() + at[b], d, static_cast<std::size_t>(m.table.blocks[b].numel) * 4);
  };
  client.fetch(0, m.layer0, sink);  // warm-up
  const std::int64_t before = client.bytes_fetched();
  const double t0 = now_seconds();
  for (int i = 0; i < reps; ++i) client.fetch(0, m.layer0, sink);
  const double t = (now_seconds() - t0) / reps;
  const double wire = static_cast<double>(client.bytes_fetched() - before) / reps;
  client.finish();
  return {t, wire};
}

// Request (8 bytes) / reply (`bytes`) between ranks 0 and 1, as bare as MPI gets.
double time_ping_pong(int rank, std::int64_t bytes, int reps) {
  std::vector<char> buf(static_cast<std::size_t>(bytes));
  std::int64_t req = 0;
  double t0 = 0.0;
  for (int i = -1; i < reps; ++i) {
    if (i == 0) t0 = now_seconds();
    if (rank == 1) {
      MPI_CHECK(MPI_Send(&req, 1, MPI_INT64_T, 0, 1, MPI_COMM_WORLD));
      MPI_CHECK(MPI_Recv(buf.data(), static_cast<int>(bytes), MPI_BYTE, 0, 2, MPI_COMM_WORLD,
                         MPI_STATUS_IGNORE));
    } else {
      MPI_CHECK(MPI_Recv(&req, 1, MPI_INT64_T, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
      MPI_CHECK(MPI_Send(buf.data(), static_cast<int>(bytes), MPI_BYTE, 1, 2, MPI_COMM_WORLD));
    }
  }
  return (now_seconds() - t0) / reps;
}

}  // namespace

int main(int argc, char** argv) {
  pdtrain::init_mpi(&argc, &argv);
  const bool small = argc > 1 && std::string(argv[1]) == "--short";
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 2) {
    if (rank == 0) std::fprintf(stderr, "bench_fetch: FAIL: run with exactly 2 ranks\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const int reps = small ? 5 : 20;
  Model m(small);
  LayoutShape shape;
  shape.holders = 1;
  double raw_seconds = 0.0;
  {
    Layout layout(shape, MPI_COMM_WORLD);
    const double mib = static_cast<double>(m.layer_bytes) / 1048576.0;
    if (rank == 1)
      std::printf("bench_fetch: one layer = %zu blocks, %.2f MiB fp32, %d fetches per codec\n",
                  m.layer0.size(), mib, reps);
    for (WireCodec c : {WireCodec::raw, WireCodec::lz4, WireCodec::bf16}) {
      const auto [t, wire] = time_fetches(m, layout, c, reps);
      if (c == WireCodec::raw) raw_seconds = t;
      if (rank == 1)
        std::printf("codec=%s wire_mib=%.2f ms_per_fetch=%.2f gib_per_s=%.2f\n", to_string(c),
                    wire / 1048576.0, 1e3 * t, static_cast<double>(m.layer_bytes) / t / (1 << 30));
    }
  }
  const double mpi = time_ping_pong(rank, m.layer_bytes, reps);
  if (rank == 1) {
    std::printf("mpi_ping_pong ms=%.2f gib_per_s=%.2f\n", 1e3 * mpi,
                static_cast<double>(m.layer_bytes) / mpi / (1 << 30));
    std::printf("ratio fetch_bandwidth/mpi_bandwidth=%.3f (target >= 0.8)\n", mpi / raw_seconds);
    std::printf("bench_fetch: ok\n");
    std::fflush(stdout);
  }
  MPI_Finalize();
  return 0;
}
