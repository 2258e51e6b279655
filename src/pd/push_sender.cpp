#include "pdtrain/pd/push_sender.hpp"

#include <limits>
#include <string>

#include "pdtrain/core/crc32c.hpp"
#include "pdtrain/core/error.hpp"
#include "pdtrain/core/mpi_check.hpp"
#include "pdtrain/core/quiet_wait.hpp"
#include "pdtrain/pd/wire.hpp"

namespace pdtrain {

namespace {

// The CRC32C of a block's rows, in order (the block as packed).
std::uint32_t place_crc(const ConstBlockPlace& t) {
  const auto row = static_cast<std::size_t>(t.row_bytes);
  std::uint32_t crc = crc32c(t.data, row);
  for (std::int64_t r = 1; r < t.rows; ++r) crc = crc32c_extend(crc, t.data + r * t.stride_bytes, row);
  return crc;
}

}  // namespace

PushSender::PushSender(const Layout& layout, const BlockTable& table,
                       const std::vector<int>& owner, WireCodec codec)
    : layout_(layout), table_(table), owner_(owner), codec_(codec) {}

// Per holder: a header message, then the payloads back to back in one contiguous message, so
// the holder copies it in itself (MPI moves a contiguous message between ranks of a node in one
// copy by the receiver, and over RDMA without the sender's CPU) while this rank computes.
PushSender::Ticket PushSender::start(std::int64_t step, const std::vector<int>& blocks,
                                     const std::vector<ConstBlockPlace>& places, bool describe) {
  PDT_CHECK(places.size() == blocks.size(), "a push needs one place per block");
  std::vector<const ConstBlockPlace*> place_of(table_.blocks.size(), nullptr);
  for (std::size_t i = 0; i < blocks.size(); ++i) place_of[blocks[i]] = &places[i];
  const auto groups = group_by_owner(blocks, owner_, layout_.shape().holders);
  const Ticket ticket = next_ticket_++;
  Pushing& out = pushes_[ticket];
  std::vector<float> packed;  // one block, for encoding
  for (int h = 0; h < static_cast<int>(groups.size()); ++h) {
    if (groups[h].empty()) continue;
    std::vector<char>& head = out.headers.emplace_back();
    std::vector<char>& payload = out.payloads.emplace_back();
    std::vector<wire::BlockHeader> sent;
    // Raw and back to back in memory: the payload is the gradients themselves.
    const char* direct = codec_ == WireCodec::raw ? place_of[groups[h].front()]->data : nullptr;
    for (int b : groups[h]) {
      const ConstBlockPlace& t = *place_of[b];
      if (!t.contiguous() || t.data != direct) direct = nullptr;
      if (direct != nullptr) direct += t.bytes();
    }
    const char* from = direct != nullptr ? place_of[groups[h].front()]->data : nullptr;
    MPI_Datatype tiles = MPI_DATATYPE_NULL;
    if (from == nullptr && describe && codec_ == WireCodec::raw) {
      std::vector<const ConstBlockPlace*> group_places;
      for (int b : groups[h]) group_places.push_back(place_of[b]);
      tiles = out.described.emplace_back(tiles_type(group_places));
    }
    std::int64_t total = 0;
    for (std::size_t i = 0; i < groups[h].size(); ++i) {
      const int b = groups[h][i];
      const ConstBlockPlace& t = *place_of[b];
      PDT_CHECK(t.bytes() == table_.blocks[b].numel * static_cast<std::int64_t>(sizeof(float)),
                "the gradient of block " + table_.blocks[b].name + " has the wrong size");
      wire::BlockHeader bh{b, 0, step, 0, -1};
      if (codec_ == WireCodec::raw) {
        bh.bytes = t.bytes();
        bh.crc = place_crc(t);
        if (from == nullptr && tiles == MPI_DATATYPE_NULL) {
          payload.resize(payload.size() + static_cast<std::size_t>(t.bytes()));
          pack_rows(t, payload.data() + payload.size() - static_cast<std::size_t>(t.bytes()));
        }
      } else {
        packed.resize(static_cast<std::size_t>(table_.blocks[b].numel));
        pack_rows(t, reinterpret_cast<char*>(packed.data()));
        const std::size_t at = payload.size();
        bh.bytes = static_cast<std::int64_t>(
            wire_encode(codec_, packed.data(), table_.blocks[b].numel, payload));
        bh.crc = crc32c(payload.data() + at, static_cast<std::size_t>(bh.bytes));
      }
      sent.push_back(bh);
      total += bh.bytes;
      pushed_ += bh.bytes;
    }
    head = wire::message_with_blocks(
        wire::PushHeader{step, static_cast<std::int64_t>(groups[h].size())}, sent);
    if (from == nullptr) from = payload.data();
    const int holder = layout_.holder_world_rank(h);
    MPI_CHECK(MPI_Isend(head.data(), static_cast<int>(head.size()), MPI_BYTE, holder, wire::kPush,
                        layout_.world(), &out.requests.emplace_back()));
    PDT_CHECK(total <= std::numeric_limits<int>::max(),
              "a push of " + std::to_string(total) + " bytes to one holder exceeds an MPI count");
    if (tiles != MPI_DATATYPE_NULL)  // the holder receives the same bytes, back to back
      MPI_CHECK(MPI_Isend(MPI_BOTTOM, 1, tiles, holder, wire::kPushPayload, layout_.world(),
                          &out.requests.emplace_back()));
    else
      MPI_CHECK(MPI_Isend(from, static_cast<int>(total), MPI_BYTE, holder, wire::kPushPayload,
                          layout_.world(), &out.requests.emplace_back()));
  }
  return ticket;
}

std::map<PushSender::Ticket, PushSender::Pushing>::iterator PushSender::pushing(Ticket ticket) {
  auto it = pushes_.find(ticket);
  PDT_CHECK(it != pushes_.end(), "unknown push " + std::to_string(ticket));
  return it;
}

void PushSender::free_push(std::map<Ticket, Pushing>::iterator it) {
  for (MPI_Datatype& t : it->second.described) MPI_CHECK(MPI_Type_free(&t));
  pushes_.erase(it);
}

// One datatype over absolute addresses: each tile's rows in order (an hvector where they are
// apart), so a push sends them as the packed bytes the holder expects, without packing here.
MPI_Datatype PushSender::tiles_type(const std::vector<const ConstBlockPlace*>& tiles) {
  std::vector<int> lengths;
  std::vector<MPI_Aint> where;
  std::vector<MPI_Datatype> types, strided;
  for (const ConstBlockPlace* t : tiles) {
    if (t->bytes() == 0) continue;
    where.emplace_back();
    MPI_CHECK(MPI_Get_address(t->data, &where.back()));
    if (t->contiguous()) {
      lengths.push_back(static_cast<int>(t->bytes()));
      types.push_back(MPI_BYTE);
      continue;
    }
    MPI_Datatype& rows = strided.emplace_back();
    MPI_CHECK(MPI_Type_create_hvector(static_cast<int>(t->rows), static_cast<int>(t->row_bytes),
                                      t->stride_bytes, MPI_BYTE, &rows));
    lengths.push_back(1);
    types.push_back(rows);
  }
  MPI_Datatype type = MPI_DATATYPE_NULL;
  MPI_CHECK(MPI_Type_create_struct(static_cast<int>(where.size()), lengths.data(), where.data(),
                                   types.data(), &type));
  MPI_CHECK(MPI_Type_commit(&type));
  for (MPI_Datatype& t : strided) MPI_CHECK(MPI_Type_free(&t));  // the struct keeps them
  return type;
}

bool PushSender::done(Ticket ticket) {
  auto it = pushing(ticket);
  int done = 0;
  MPI_CHECK(MPI_Testall(static_cast<int>(it->second.requests.size()), it->second.requests.data(),
                        &done, MPI_STATUSES_IGNORE));
  if (done) free_push(it);
  return done != 0;
}

void PushSender::wait(Ticket ticket) {
  auto it = pushing(ticket);
  Pushing& p = it->second;
  if (p.described.empty())  // contiguous: the holder moves it alone
    wait_all_quietly(static_cast<int>(p.requests.size()), p.requests.data());
  else
    wait_all_yielding(static_cast<int>(p.requests.size()), p.requests.data());
  free_push(it);
}

}  // namespace pdtrain
