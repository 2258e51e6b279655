#include "pdtrain/pd/remote_holders.hpp"

#include <cstdlib>
#include <cstring>

#include "pdtrain/core/crc32c.hpp"
#include "pdtrain/core/mpi_check.hpp"
#include "pdtrain/core/quiet_wait.hpp"
#include "pdtrain/pd/wire.hpp"

namespace pdtrain {

RemoteHolders::RemoteHolders(const Layout& layout, const BlockTable& table, std::vector<int> owner,
                             WireCodec fetch_codec, WireCodec push_codec)
    : layout_(layout), table_(table), owner_(std::move(owner)), fetch_codec_(fetch_codec),
      push_codec_(push_codec) {
  // Test hook: PDTRAIN_TEST_FLIP_FETCH_BIT=<version> flips one bit of the first block this
  // rank receives at that version, so tests can check that corruption is caught and named.
  if (const char* v = std::getenv("PDTRAIN_TEST_FLIP_FETCH_BIT")) flip_at_version_ = std::atoll(v);
}

std::vector<std::vector<int>> RemoteHolders::by_holder(const std::vector<int>& blocks) const {
  std::vector<std::vector<int>> out(static_cast<std::size_t>(layout_.shape().holders));
  for (int b : blocks) out[owner_[b]].push_back(b);
  return out;
}

UpdateInfo RemoteHolders::fetch(std::int64_t version, const std::vector<int>& blocks,
                                const BlockSink& sink) {
  const auto groups = by_holder(blocks);
  replies_.resize(groups.size());
  // Fan-out: the data-parallel replicas of a (pp, tp) position need the same blocks, so only
  // replica 0 asks the holders and relays the replies to the others with a broadcast. A holder
  // sends each block once per step whatever dp is.
  if (layout_.dp_rank() == 0) fetch_from_holders(version, groups);
  if (layout_.shape().dp > 1) relay_to_replicas();
  return verify_and_deliver(version, groups, sink);
}

void RemoteHolders::fetch_from_holders(std::int64_t version,
                                       const std::vector<std::vector<int>>& groups) {
  const int H = static_cast<int>(groups.size());
  std::vector<std::vector<char>> requests(H);
  std::vector<MPI_Request> reqs;
  for (int h = 0; h < H; ++h) {
    replies_[h].clear();
    if (groups[h].empty()) continue;
    const wire::FetchRequest fr{version, static_cast<std::int64_t>(groups[h].size())};
    requests[h].resize(sizeof(fr) + groups[h].size() * sizeof(std::int32_t));
    std::memcpy(requests[h].data(), &fr, sizeof(fr));
    std::memcpy(requests[h].data() + sizeof(fr), groups[h].data(),
                groups[h].size() * sizeof(std::int32_t));
    reqs.emplace_back();
    MPI_CHECK(MPI_Isend(requests[h].data(), static_cast<int>(requests[h].size()), MPI_BYTE,
                        layout_.holder_world_rank(h), wire::kFetchRequest, layout_.world(),
                        &reqs.back()));
  }
  // Replies are as long as their encoding: take them in whatever order they arrive, sizing
  // each from its probe.
  int pending = 0;
  for (int h = 0; h < H; ++h) pending += groups[h].empty() ? 0 : 1;
  Backoff backoff;
  while (pending > 0) {
    int flag = 0;
    MPI_Message m;
    MPI_Status st;
    MPI_CHECK(MPI_Improbe(MPI_ANY_SOURCE, wire::kFetchReply, layout_.world(), &flag, &m, &st));
    if (!flag) {
      backoff.pause();
      continue;
    }
    backoff.reset();
    int bytes = 0;
    MPI_CHECK(MPI_Get_count(&st, MPI_BYTE, &bytes));
    std::vector<char>& r = replies_[st.MPI_SOURCE];  // holders are world ranks 0..H-1
    r.resize(static_cast<std::size_t>(bytes));
    MPI_CHECK(MPI_Mrecv(r.data(), bytes, MPI_BYTE, &m, MPI_STATUS_IGNORE));
    from_holders_ += bytes;
    --pending;
  }
  wait_all_quietly(static_cast<int>(reqs.size()), reqs.data());
}

void RemoteHolders::relay_to_replicas() {
  // Sizes first (they depend on the encoding), then the replies themselves.
  std::vector<std::int64_t> sizes(replies_.size());
  for (std::size_t h = 0; h < replies_.size(); ++h)
    sizes[h] = static_cast<std::int64_t>(replies_[h].size());
  MPI_Request r;
  MPI_CHECK(MPI_Ibcast(sizes.data(), static_cast<int>(sizes.size()), MPI_INT64_T, 0,
                       layout_.dp_comm(), &r));
  wait_quietly(&r);
  std::vector<MPI_Request> reqs;
  for (std::size_t h = 0; h < replies_.size(); ++h) {
    replies_[h].resize(static_cast<std::size_t>(sizes[h]));
    if (sizes[h] == 0) continue;
    reqs.emplace_back();
    MPI_CHECK(MPI_Ibcast(replies_[h].data(), static_cast<int>(sizes[h]), MPI_BYTE, 0,
                         layout_.dp_comm(), &reqs.back()));
  }
  wait_all_quietly(static_cast<int>(reqs.size()), reqs.data());
}

UpdateInfo RemoteHolders::verify_and_deliver(std::int64_t version,
                                             const std::vector<std::vector<int>>& groups,
                                             const BlockSink& sink) {
  for (int h = 0; h < static_cast<int>(groups.size()); ++h) {
    if (groups[h].empty()) continue;
    wire::ReplyHeader rh;
    std::memcpy(&rh, replies_[h].data(), sizeof(rh));
    PDT_CHECK(rh.version == version, "holder " + std::to_string(h) + " answered with version " +
                                         std::to_string(rh.version) + " for a fetch of version " +
                                         std::to_string(version));
    stop_ = stop_ || rh.stop != 0;
    for (std::int64_t i = 0; i < rh.n_recent && i < wire::kMaxRecentUpdates; ++i)
      known_[rh.recent[i].version] =
          UpdateInfo{rh.recent[i].version, rh.recent[i].grad_norm, rh.recent[i].lr};
    const char* hdr = replies_[h].data() + sizeof(rh);
    char* data = replies_[h].data() + sizeof(rh) + groups[h].size() * sizeof(wire::BlockHeader);
    if (version == flip_at_version_) {
      data[0] ^= 0x10;
      flip_at_version_ = -1;
    }
    for (std::size_t i = 0; i < groups[h].size(); ++i) {
      wire::BlockHeader bh;
      std::memcpy(&bh, hdr + i * sizeof(bh), sizeof(bh));
      const int b = groups[h][i];
      const BlockDesc& d = table_.blocks[b];
      PDT_CHECK(bh.id == b && bh.version == version,
                "block " + d.name + " arrived as id " + std::to_string(bh.id) + " version " +
                    std::to_string(bh.version) + ", expected version " + std::to_string(version));
      const auto nb = static_cast<std::size_t>(bh.bytes);
      PDT_CHECK(crc32c(data, nb) == bh.crc,
                "CRC mismatch in block " + d.name + " (version " + std::to_string(version) +
                    ") fetched from holder " + std::to_string(h));
      decoded_.resize(static_cast<std::size_t>(d.numel));
      PDT_CHECK(wire_decode(fetch_codec_, data, nb, decoded_.data(), d.numel),
                std::string("cannot decode (") + to_string(fetch_codec_) + ") block " + d.name);
      sink(b, decoded_.data());
      data += nb;
      fetched_ += static_cast<std::int64_t>(nb);
    }
  }
  return known_.count(version) ? known_.at(version) : UpdateInfo{version, 0.0, 0.0};
}

std::optional<UpdateInfo> RemoteHolders::update_info(std::int64_t version) const {
  auto it = known_.find(version);
  if (it == known_.end()) return std::nullopt;
  return it->second;
}

void RemoteHolders::push(std::int64_t step, const std::vector<int>& blocks, const float* grads) {
  const auto groups = by_holder(blocks);
  // Offsets of each block's gradient inside `grads` (packed in the order of `blocks`).
  std::vector<const float*> where(table_.blocks.size(), nullptr);
  const float* p = grads;
  for (int b : blocks) {
    where[b] = p;
    p += table_.blocks[b].numel;
  }
  std::vector<std::vector<char>> msgs;
  std::vector<MPI_Request> reqs;
  for (int h = 0; h < static_cast<int>(groups.size()); ++h) {
    if (groups[h].empty()) continue;
    const std::size_t head =
        sizeof(wire::PushHeader) + groups[h].size() * sizeof(wire::BlockHeader);
    std::vector<char>& m = msgs.emplace_back(head);
    const wire::PushHeader ph{step, static_cast<std::int64_t>(groups[h].size())};
    std::memcpy(m.data(), &ph, sizeof(ph));
    for (std::size_t i = 0; i < groups[h].size(); ++i) {
      const int b = groups[h][i];
      const std::size_t at = m.size();
      const std::size_t nb = wire_encode(push_codec_, where[b], table_.blocks[b].numel, m);
      const wire::BlockHeader bh{b, crc32c(m.data() + at, nb), step,
                                 static_cast<std::int64_t>(nb)};
      std::memcpy(m.data() + sizeof(ph) + i * sizeof(bh), &bh, sizeof(bh));
      pushed_ += static_cast<std::int64_t>(nb);
    }
    reqs.emplace_back();
    MPI_CHECK(MPI_Isend(m.data(), static_cast<int>(m.size()), MPI_BYTE,
                        layout_.holder_world_rank(h), wire::kPush, layout_.world(), &reqs.back()));
  }
  wait_all_quietly(static_cast<int>(reqs.size()), reqs.data());
}

std::uint32_t RemoteHolders::finish() {
  std::int64_t none = 0;
  for (int h = 0; h < layout_.shape().holders; ++h)
    MPI_CHECK(MPI_Send(&none, 1, MPI_INT64_T, layout_.holder_world_rank(h), wire::kDone,
                       layout_.world()));
  if (!layout_.is_reporter()) return 0;
  std::uint32_t crc = 0;
  MPI_Request r;
  MPI_CHECK(MPI_Irecv(&crc, 1, MPI_UINT32_T, layout_.holder_world_rank(0), wire::kFinalCrc,
                      layout_.world(), &r));
  wait_quietly(&r);
  return crc;
}

}  // namespace pdtrain
