// Receiving fetched blocks in place (FetchClient::start_fetch_in_place into a streamed
// StageParams, the parameter cache's path): every unit ends up holding exactly what the old
// path (a receive buffer, then unpack_param) writes from the holder's bits, for raw and bf16
// wire codecs in fp32 and bf16 precision, for contiguous blocks and strided ones (row-parallel
// weights are column slabs), with and without the fetch thread, and through the data-parallel
// relay (dp 2, where replies keep the buffer path), by MPI message and copied from the holder's
// shared segment. A holder answering a later request first still lands each reply in its own
// fetch's place. 3 ranks: a holder and two compute ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "pdtrain/layout/layout.hpp"
#include "pdtrain/model/catalog.hpp"
#include "pdtrain/model/stage_params.hpp"
#include "pdtrain/pd/fetch_client.hpp"
#include "pdtrain/pd/holder_server.hpp"
#include "pdtrain/pd/shared_segments.hpp"
#include "pdtrain/pd/wire_codec.hpp"
#include "run_helpers.hpp"

namespace pdtrain {
namespace {

using test::world_rank;

struct Model {
  Model() {
    ModelConfig m;
    m.n_layer = 2;
    m.n_head = 4;
    m.d_model = 64;
    m.vocab_size = 256;
    m.seq_len = 32;
    cat = std::make_unique<ParamCatalog>(resolve_model_shape(m));
    for (const BlockInfo& b : cat->blocks())
      table.blocks.push_back(BlockDesc{b.numel(), cat->tensor(b.tensor).weight_decay,
                                       cat->block_name(b)});
    table.init = [this](int id, float* out) { cat->init_block(cat->block(id), 0.02, 1, out); };
    table.canonical_crc = [](const std::vector<const float*>&) { return 0u; };
  }
  std::unique_ptr<ParamCatalog> cat;
  BlockTable table;
};

// A whole-model stage with every unit bound to its own memory.
struct Stage {
  Stage(const ParamCatalog& cat, Precision precision)
      : params(cat, StageSpec{0, cat.shape().n_layer, true, true, 1, 0},
               StageParams::Storage::streamed, precision) {
    for (int u = 0; u < params.num_units(); ++u) {
      memory.emplace_back(static_cast<std::size_t>(params.unit_storage(u)), -1.0f);
      params.bind_unit(u, memory.back().data(), memory.back().data());
    }
  }
  StageParams params;
  std::vector<std::vector<float>> memory;  // per unit
};

// What the holder serves at version 0, as a compute rank decodes it.
std::vector<float> served(const Model& m, int id, WireCodec codec) {
  std::vector<float> v(static_cast<std::size_t>(m.table.blocks[id].numel));
  m.table.init(id, v.data());
  std::vector<char> wire;
  wire_encode(codec, v.data(), static_cast<std::int64_t>(v.size()), wire);
  EXPECT_TRUE(wire_decode(codec, wire.data(), wire.size(), v.data(), static_cast<std::int64_t>(v.size())));
  return v;
}

struct Counts {
  int placed = 0, strided = 0, sunk = 0;
};

// Starts the fetch of unit u's blocks at `version`, counting where blocks went.
ParameterService::Ticket start_unit(FetchClient& client, Stage& s, int u, std::int64_t version,
                                    Counts& n) {
  const ParamCatalog& cat = s.params.catalog();
  BlockTarget target{[&s, &n, &cat](int b, int width) {
                       const BlockPlace p = s.params.block_place(cat.block(b), width);
                       n.placed += p.data != nullptr;
                       n.strided += p.data != nullptr && !p.contiguous();
                       return p;
                     },
                     [&s, &cat](int b, int width, std::int64_t r0, std::int64_t r1) {
                       s.params.finish_landed_rows(cat.block(b), width, r0, r1);
                     }};
  return client.start_fetch_in_place(
      version, s.params.unit_blocks(u),
      [&s, &n, &cat](int b, const float* d) {
        ++n.sunk;
        s.params.unpack_param(cat.block(b), d);
      },
      std::move(target));
}

struct Case {
  WireCodec codec;
  Precision precision;
  bool thread;
  bool shared = false;  // payloads copied from the holder's shared segment, not sent
  std::string name() const {
    return std::string(to_string(codec)) + (precision == Precision::bf16 ? "/bf16" : "/fp32") +
           (thread ? "/thread" : "") + (shared ? "/shared" : "");
  }
};

// The holder's shared segment for case c (collective over the layout's world), or null.
std::unique_ptr<SharedSegments> segments_for(const Model& m, const Case& c, const Layout& layout,
                                             const std::vector<int>& owner) {
  if (!c.shared) return nullptr;
  std::string why_not;
  auto s = share_holder_segments(layout, m.table, owner, c.codec, 0, 0, &why_not);
  EXPECT_NE(s, nullptr) << why_not;
  return s;
}

// One case on `comm` (a holder and dp compute ranks): fetches every unit, all in flight at
// once, and compares each unit's memory with the old path's from the holder's bits.
void run_case(const Model& m, const Case& c, MPI_Comm comm, int dp) {
  LayoutShape shape;
  shape.holders = 1;
  shape.dp = dp;
  Layout layout(shape, comm);
  const std::vector<int> owner(m.table.blocks.size(), 0);
  const std::unique_ptr<SharedSegments> segments = segments_for(m, c, layout, owner);
  if (layout.is_holder()) {
    HolderServer server(layout, m.table, owner, std::vector<int>(owner.size(), 1), AdamWConfig{},
                        c.codec, WireCodec::raw, StalenessPlan{}, nullptr);
    if (segments) server.publish_through(segments.get());
    server.run();
    return;
  }
  FetchClient client(layout, m.table, owner, c.codec, WireCodec::raw, c.thread, segments.get());
  Stage got(*m.cat, c.precision), want(*m.cat, c.precision);
  Counts n;
  std::vector<ParameterService::Ticket> tickets;
  for (int u = 0; u < got.params.num_units(); ++u) tickets.push_back(start_unit(client, got, u, 0, n));
  for (ParameterService::Ticket t : tickets) client.finish_fetch(t);
  for (int b : want.params.needed_blocks())
    want.params.unpack_param(m.cat->block(b), served(m, b, c.codec).data());
  for (int u = 0; u < got.params.num_units(); ++u)
    EXPECT_EQ(0, std::memcmp(got.memory[u].data(), want.memory[u].data(),
                             got.memory[u].size() * sizeof(float)))
        << c.name() << " dp " << dp << ": unit " << got.params.unit_name(u);
  const int blocks = static_cast<int>(want.params.needed_blocks().size());
  // With relays (dp 2) replies keep the buffer path (contiguous relays, see FetchClient).
  const bool in_place = dp == 1 && (c.codec == WireCodec::raw || (c.codec == WireCodec::bf16 &&
                                                                  c.precision == Precision::bf16));
  EXPECT_EQ(n.placed, in_place ? blocks : 0) << c.name();
  EXPECT_EQ(n.sunk, in_place ? 0 : blocks) << c.name();
  if (in_place) EXPECT_GT(n.strided, 0) << c.name();  // attprojw, fcprojw: column slabs
  // Shared: replica 0 copied every payload from the segment (the others got them relayed).
  const bool copies = c.shared && layout.dp_rank() == 0;
  EXPECT_EQ(client.bytes_from_shared_memory(), copies ? client.bytes_fetched() : 0) << c.name();
  client.finish_and_checksum();
}

const std::vector<Case> kCases = {
    {WireCodec::raw, Precision::fp32, false},  {WireCodec::raw, Precision::fp32, true},
    {WireCodec::bf16, Precision::bf16, false}, {WireCodec::bf16, Precision::bf16, true},
    {WireCodec::raw, Precision::bf16, false},  {WireCodec::bf16, Precision::fp32, false},
    {WireCodec::lz4, Precision::fp32, false},
    {WireCodec::raw, Precision::fp32, false, true}, {WireCodec::raw, Precision::fp32, true, true},
    {WireCodec::bf16, Precision::bf16, false, true}, {WireCodec::raw, Precision::bf16, false, true},
    {WireCodec::bf16, Precision::fp32, true, true}};

TEST(FetchInPlace, UnitsHoldTheHoldersBitsDp1) {
  ASSERT_GE(test::world_size(), 2);
  const Model m;
  MPI_Comm pair = test::group_of(MPI_COMM_WORLD, 2, 1);
  if (pair != MPI_COMM_NULL) {
    for (const Case& c : kCases) run_case(m, c, pair, 1);
    MPI_Comm_free(&pair);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(FetchInPlace, UnitsHoldTheHoldersBitsThroughTheRelayDp2) {
  ASSERT_EQ(test::world_size(), 3);
  const Model m;
  for (const Case& c : kCases) run_case(m, c, MPI_COMM_WORLD, 2);
}

// Unit 0 at version 1 waits at the holder for an update; unit 1 (same size) at version 0 is
// answered first, lands in unit 0's places (the oldest fetch awaiting that holder) and must be
// moved to unit 1. Both then hold what a plain buffered fetch gets.
TEST(FetchInPlace, ReplyAnsweredOutOfOrderMovesToItsFetch) {
  ASSERT_GE(test::world_size(), 2);
  const Model m;
  MPI_Comm pair = test::group_of(MPI_COMM_WORLD, 2, 1);
  if (pair == MPI_COMM_NULL) {
    MPI_Barrier(MPI_COMM_WORLD);
    return;
  }
  {
    LayoutShape shape;
    shape.holders = 1;
    Layout layout(shape, pair);
    const std::vector<int> owner(m.table.blocks.size(), 0);
    if (layout.is_holder()) {
      HolderServer server(layout, m.table, owner, std::vector<int>(owner.size(), 1),
                          AdamWConfig{}, WireCodec::raw, WireCodec::raw, StalenessPlan{}, nullptr);
      server.run();
    } else {
      FetchClient client(layout, m.table, owner, WireCodec::raw, WireCodec::raw, false);
      Stage got(*m.cat, Precision::fp32), want(*m.cat, Precision::fp32);
      Counts n;
      const auto t0 = start_unit(client, got, 0, 1, n);
      const auto t1 = start_unit(client, got, 1, 0, n);
      for (int i = 0; i < 200; ++i) {  // unit 1's reply arrives meanwhile
        client.progress();
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      std::vector<int> all;
      std::int64_t numel = 0;
      for (std::size_t b = 0; b < m.table.blocks.size(); ++b)
        all.push_back(static_cast<int>(b)), numel += m.table.blocks[b].numel;
      const std::vector<float> zeros(static_cast<std::size_t>(numel), 0.0f);
      client.push(1, all, zeros.data());  // the update that makes version 1
      client.finish_fetch(t0);
      client.finish_fetch(t1);
      client.fetch(1, want.params.unit_blocks(0), [&](int b, const float* d) {
        want.params.unpack_param(m.cat->block(b), d);
      });
      for (int b : want.params.unit_blocks(1))  // version 0 is gone from the holder now
        want.params.unpack_param(m.cat->block(b), served(m, b, WireCodec::raw).data());
      for (int u : {0, 1})
        EXPECT_EQ(0, std::memcmp(got.memory[u].data(), want.memory[u].data(),
                                 got.memory[u].size() * sizeof(float)))
            << "unit " << got.params.unit_name(u);
      EXPECT_EQ(n.sunk, 0);
      EXPECT_EQ(client.replies_out_of_order(), 1);  // the case above did happen
      client.finish_and_checksum();
    }
  }
  MPI_Comm_free(&pair);
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace pdtrain
