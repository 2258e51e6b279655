// The PD fetch layer's bandwidth against raw MPI, on two ranks (a holder and a compute rank):
// the compute rank fetches one GPT-2 124M layer's blocks into the layer's unit storage of a
// streamed StageParams (the cache's path: received in place where the codec allows, checked
// there: id, version, CRC32C; bf16 in bf16 precision, widened in the same pass) again and
// again, per wire codec, and then the same bytes go through a bare MPI request/reply
// ping-pong. "raw_buffered" is the raw fetch through a receive buffer and unpack_param (the
// path without a target). Prints bytes on the wire, time per fetch and the ratio fetch
// bandwidth / MPI bandwidth (target >= 0.8 for raw), from mean times and from the best of the
// repetitions (steadier on a machine shared with other work), and the median over rounds that
// alternate raw fetches with ping-pongs (the figure to quote on a shared machine). The fetches
// go through the holder's shared segment (what pdtrain does on one node) and, in the rows
// marked mpi_message, by MPI message (pd.fetch_path = mpi; what crosses nodes).
//   mpirun -np 2 perf/bench_fetch [--short]
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "pdtrain/core/crc32c.hpp"
#include "pdtrain/core/mpi_check.hpp"
#include "pdtrain/core/timer.hpp"
#include "pdtrain/deck/deck.hpp"
#include "pdtrain/layout/layout.hpp"
#include "pdtrain/model/catalog.hpp"
#include "pdtrain/model/stage_params.hpp"
#include "pdtrain/pd/holder_server.hpp"
#include "pdtrain/pd/fetch_client.hpp"
#include "pdtrain/pd/shared_segments.hpp"

namespace {

using namespace pdtrain;

// Seconds per repetition: mean and best.
struct Timing {
  double mean = 0.0, best = 0.0;
};

// `once` run `reps` times after one untimed warm-up run: mean and best.
template <typename F>
Timing time_reps(int reps, F&& once) {
  once();
  Timing t{0.0, 1e30};
  for (int i = 0; i < reps; ++i) {
    const double t0 = now_seconds();
    once();
    const double dt = now_seconds() - t0;
    t.mean += dt / reps;
    t.best = std::min(t.best, dt);
  }
  return t;
}

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
    // Real values where they are fetched (lz4's ratio depends on them); the rest of the model
    // only sits on the holder, and initializing all 124M values per holder took 35 s here.
    table.init = [this](int id, float* out) {
      const BlockInfo& b = cat->block(id);
      if (b.layer == 0)
        cat->init_block(b, 0.02, 1, out);
      else
        std::fill(out, out + b.numel(), 0.0f);
    };
    table.canonical_crc = [](const std::vector<const float*>&) { return 0u; };
    for (const BlockInfo& b : cat->blocks())
      if (b.layer == 0) layer0.push_back(b.id), layer_bytes += b.bytes();
  }
  std::unique_ptr<ParamCatalog> cat;
  BlockTable table;
  std::vector<int> layer0;
  std::int64_t layer_bytes = 0;
};

// How the payloads travel: through the holder's shared segment (pd.fetch_path = auto, the
// default on one node) or as MPI messages (pd.fetch_path = mpi).
enum class Path { shared, message };

// One codec: the holder serves, the compute rank fetches `reps` times after a warm-up into
// layer 0's unit (in place unless `buffered`); returns seconds per fetch and wire bytes per
// fetch (compute rank).
std::pair<Timing, double> time_fetches(const Model& m, const Layout& layout, WireCodec codec,
                                       int reps, Path path, bool buffered = false) {
  const std::vector<int> owner(m.table.blocks.size(), 0);
  std::unique_ptr<SharedSegments> segments;
  if (path == Path::shared) {
    std::string why_not;
    segments = share_holder_segments(layout, m.table, owner, codec, 0, 0, &why_not);
    PDT_CHECK(segments != nullptr, "bench_fetch: no shared segments: " + why_not);
  }
  if (layout.is_holder()) {
    HolderServer server(layout, m.table, owner, std::vector<int>(owner.size(), 1), AdamWConfig{},
                        codec, WireCodec::raw, StalenessPlan{}, nullptr);
    if (segments) server.publish_through(segments.get());
    server.run();
    return {Timing{}, 0.0};
  }
  FetchClient client(layout, m.table, owner, codec, WireCodec::raw, false, segments.get());
  const StageSpec layer0{0, 1, false, false, 1, 0};
  StageParams stage(*m.cat, layer0, StageParams::Storage::streamed,
                    codec == WireCodec::bf16 ? Precision::bf16 : Precision::fp32);
  std::vector<float> unit(static_cast<std::size_t>(stage.unit_storage(0)));
  stage.bind_unit(0, unit.data(), unit.data());
  auto sink = [&](int b, const float* d) { stage.unpack_param(m.cat->block(b), d); };
  BlockTarget target;
  if (!buffered)
    target = BlockTarget{
        [&](int b, int width) { return stage.block_place(m.cat->block(b), width); },
        [&](int b, int width, std::int64_t r0, std::int64_t r1) {
          stage.finish_landed_rows(m.cat->block(b), width, r0, r1);
        }};
  auto fetch = [&] {
    client.finish_fetch(client.start_fetch_in_place(0, m.layer0, sink, target));
  };
  const Timing t = time_reps(reps, fetch);
  // Wire bytes of the timed fetches (the warm-up's excluded): the same every fetch.
  const double wire = static_cast<double>(client.bytes_fetched()) / (reps + 1);
  client.finish_and_checksum();
  return {t, wire};
}

// Request (8 bytes) / reply (`bytes`) between ranks 0 and 1, as bare as MPI gets. With
// `pieces` (the blocks' sizes), rank 0 sends from that many separate buffers through an
// hindexed datatype, as a holder does: Open MPI's shared-memory path then packs the message
// through fragments instead of one single-copy (CMA) transfer, the fetch's ceiling here.
Timing time_ping_pong(int rank, std::int64_t bytes, int reps,
                      const std::vector<std::int64_t>& pieces = {}) {
  std::vector<char> buf(static_cast<std::size_t>(bytes));
  std::vector<std::vector<char>> parts;
  MPI_Datatype type = MPI_BYTE;
  int count = static_cast<int>(bytes);
  if (!pieces.empty() && rank == 0) {
    std::vector<MPI_Aint> at;
    std::vector<int> len;
    for (std::int64_t n : pieces) {
      parts.emplace_back(static_cast<std::size_t>(n));
      at.emplace_back();
      MPI_CHECK(MPI_Get_address(parts.back().data(), &at.back()));
      len.push_back(static_cast<int>(n));
    }
    MPI_CHECK(MPI_Type_create_hindexed(static_cast<int>(at.size()), len.data(), at.data(),
                                       MPI_BYTE, &type));
    MPI_CHECK(MPI_Type_commit(&type));
    count = 1;
  }
  void* send_from = type == MPI_BYTE ? static_cast<void*>(buf.data()) : MPI_BOTTOM;
  std::int64_t req = 0;
  const Timing t = time_reps(reps, [&] {
    if (rank == 1) {
      MPI_CHECK(MPI_Send(&req, 1, MPI_INT64_T, 0, 1, MPI_COMM_WORLD));
      MPI_CHECK(MPI_Recv(buf.data(), static_cast<int>(bytes), MPI_BYTE, 0, 2, MPI_COMM_WORLD,
                         MPI_STATUS_IGNORE));
    } else {
      MPI_CHECK(MPI_Recv(&req, 1, MPI_INT64_T, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
      MPI_CHECK(MPI_Send(send_from, count, type, 1, 2, MPI_COMM_WORLD));
    }
  });
  if (type != MPI_BYTE) MPI_CHECK(MPI_Type_free(&type));
  return t;
}

// Load on a shared machine moves from one second to the next, and the table above times each
// codec and the ping-pong minutes apart. Here raw fetches and ping-pongs alternate in short
// rounds; each round's ratio compares the two under the same load, and the median of the
// rounds is the figure to quote. Returns the rounds' ratios (compute rank; empty elsewhere).
constexpr int kPairedReps = 5;

std::vector<double> paired_ratios(const Model& m, int rank, int rounds, Path path) {
  std::vector<double> out;
  LayoutShape shape;
  shape.holders = 1;
  for (int r = 0; r < rounds; ++r) {
    double fetch_best = 0.0;
    {
      Layout layout(shape, MPI_COMM_WORLD);
      fetch_best = time_fetches(m, layout, WireCodec::raw, kPairedReps, path).first.best;
    }
    const Timing pp = time_ping_pong(rank, m.layer_bytes, kPairedReps);
    if (rank == 1) out.push_back(pp.best / fetch_best);
  }
  return out;
}

double median_of(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const std::size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

// The same request/reply with the reply as one message per block (the fetch's protocol
// without its header, checks and tiles): what the per-block messages cost by themselves, and
// with `check`, what taking each block's CRC32C after it lands adds. Splits the fetch's gap to
// the ping-pong into protocol and check.
Timing time_per_block_ping_pong(int rank, const std::vector<std::int64_t>& pieces, int reps,
                                bool check) {
  std::int64_t total = 0;
  for (std::int64_t n : pieces) total += n;
  std::vector<char> buf(static_cast<std::size_t>(total), 1);
  std::vector<MPI_Request> reqs(pieces.size());
  std::int64_t req = 0;
  std::uint32_t sink = 0;
  const Timing t = time_reps(reps, [&] {
    if (rank == 1) {
      MPI_CHECK(MPI_Send(&req, 1, MPI_INT64_T, 0, 1, MPI_COMM_WORLD));
      std::int64_t at = 0;
      for (std::size_t b = 0; b < pieces.size(); ++b) {
        MPI_CHECK(MPI_Irecv(buf.data() + at, static_cast<int>(pieces[b]), MPI_BYTE, 0, 3,
                            MPI_COMM_WORLD, &reqs[b]));
        at += pieces[b];
      }
      at = 0;
      for (std::size_t b = 0; b < pieces.size(); ++b) {  // in order, as the fetch checks them
        MPI_CHECK(MPI_Wait(&reqs[b], MPI_STATUS_IGNORE));
        if (check) sink ^= crc32c(buf.data() + at, static_cast<std::size_t>(pieces[b]));
        at += pieces[b];
      }
    } else {
      MPI_CHECK(MPI_Recv(&req, 1, MPI_INT64_T, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
      std::int64_t at = 0;
      for (std::size_t b = 0; b < pieces.size(); ++b) {
        MPI_CHECK(MPI_Isend(buf.data() + at, static_cast<int>(pieces[b]), MPI_BYTE, 1, 3,
                            MPI_COMM_WORLD, &reqs[b]));
        at += pieces[b];
      }
      MPI_CHECK(MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE));
    }
  });
  if (sink == 0xFFFFFFFFu) std::printf(" ");  // keeps the checks from being optimized away
  return t;
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
  Timing raw;
  {
    Layout layout(shape, MPI_COMM_WORLD);
    const double mib = static_cast<double>(m.layer_bytes) / 1048576.0;
    if (rank == 1)
      std::printf("bench_fetch: one layer = %zu blocks, %.2f MiB fp32, %d fetches per codec\n",
                  m.layer0.size(), mib, reps);
    struct Row {
      WireCodec codec;
      Path path;
      bool buffered;
    };
    const Row rows[] = {{WireCodec::raw, Path::shared, false},
                        {WireCodec::raw, Path::message, false},
                        {WireCodec::raw, Path::message, true},
                        {WireCodec::lz4, Path::message, false},
                        {WireCodec::bf16, Path::shared, false},
                        {WireCodec::bf16, Path::message, false}};
    for (const Row& row : rows) {
      const auto [t, wire] = time_fetches(m, layout, row.codec, reps, row.path, row.buffered);
      if (row.codec == WireCodec::raw && row.path == Path::shared) raw = t;
      if (rank == 1)
        std::printf("codec=%s%s path=%s wire_mib=%.2f ms_per_fetch=%.2f best_ms=%.2f "
                    "gib_per_s=%.2f\n",
                    to_string(row.codec), row.buffered ? "_buffered" : "",
                    row.path == Path::shared ? "shared_memory" : "mpi_message", wire / 1048576.0,
                    1e3 * t.mean, 1e3 * t.best,
                    static_cast<double>(m.layer_bytes) / t.mean / (1 << 30));
    }
  }
  const std::vector<double> paired = paired_ratios(m, rank, small ? 3 : 8, Path::shared);
  const std::vector<double> paired_message = paired_ratios(m, rank, small ? 3 : 8, Path::message);
  const Timing mpi = time_ping_pong(rank, m.layer_bytes, reps);
  std::vector<std::int64_t> pieces;
  for (int b : m.layer0) pieces.push_back(m.table.blocks[b].numel * 4);
  const Timing pieces_t = time_ping_pong(rank, m.layer_bytes, reps, pieces);
  const Timing per_block = time_per_block_ping_pong(rank, pieces, reps, false);
  const Timing per_block_crc = time_per_block_ping_pong(rank, pieces, reps, true);
  if (rank == 1) {
    std::printf("mpi_ping_pong ms=%.2f best_ms=%.2f gib_per_s=%.2f\n", 1e3 * mpi.mean,
                1e3 * mpi.best, static_cast<double>(m.layer_bytes) / mpi.mean / (1 << 30));
    std::printf("mpi_ping_pong_hindexed_send ms=%.2f best_ms=%.2f gib_per_s=%.2f\n",
                1e3 * pieces_t.mean, 1e3 * pieces_t.best,
                static_cast<double>(m.layer_bytes) / pieces_t.mean / (1 << 30));
    std::printf("mpi_per_block_messages ms=%.2f best_ms=%.2f | with each block's crc32c ms=%.2f "
                "best_ms=%.2f\n",
                1e3 * per_block.mean, 1e3 * per_block.best, 1e3 * per_block_crc.mean,
                1e3 * per_block_crc.best);
    std::printf("ratio best: fetch/mpi=%.3f fetch/mpi_hindexed_send=%.3f\n",
                mpi.best / raw.best, pieces_t.best / raw.best);
    std::printf("ratio fetch_bandwidth/mpi_bandwidth=%.3f (target >= 0.8)\n",
                mpi.mean / raw.mean);
    std::printf("paired rounds (raw fetch through shared memory, then ping-pong, %d each; "
                "best/best):", kPairedReps);
    for (double r : paired) std::printf(" %.3f", r);
    std::printf("\npaired rounds (raw fetch by MPI message, then ping-pong):");
    for (double r : paired_message) std::printf(" %.3f", r);
    std::printf("\nratio paired median fetch_bandwidth/mpi_bandwidth=%.3f (target >= 0.8; by "
                "MPI message %.3f)\n",
                median_of(paired), median_of(paired_message));
    std::printf("bench_fetch: ok\n");
    std::fflush(stdout);
  }
  MPI_Finalize();
  return 0;
}
