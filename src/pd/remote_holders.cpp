#include "pdtrain/pd/remote_holders.hpp"

#include <cstdlib>
#include <cstring>

#include "pdtrain/core/crc32c.hpp"
#include "pdtrain/core/mpi_check.hpp"
#include "pdtrain/core/quiet_wait.hpp"
#include "pdtrain/pd/wire.hpp"

namespace pdtrain {

RemoteHolders::RemoteHolders(const Layout& layout, const BlockTable& table, std::vector<int> owner)
    : layout_(layout), table_(table), owner_(std::move(owner)) {
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
  const int H = static_cast<int>(groups.size());
  replies_.resize(H);
  for (int h = 0; h < H; ++h) {
    std::size_t bytes = 0;
    if (!groups[h].empty()) {
      bytes = sizeof(wire::ReplyHeader) + groups[h].size() * sizeof(wire::BlockHeader);
      for (int b : groups[h]) bytes += static_cast<std::size_t>(table_.blocks[b].numel) * 4;
    }
    replies_[h].resize(bytes);
  }
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
  // Post every receive before any request, so replies never wait for a matching receive.
  for (int h = 0; h < H; ++h) {
    if (groups[h].empty()) continue;
    reqs.emplace_back();
    MPI_CHECK(MPI_Irecv(replies_[h].data(), static_cast<int>(replies_[h].size()), MPI_BYTE,
                        layout_.holder_world_rank(h), wire::kFetchReply, layout_.world(),
                        &reqs.back()));
  }
  for (int h = 0; h < H; ++h) {
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
  wait_all_quietly(static_cast<int>(reqs.size()), reqs.data());
  for (const auto& r : replies_) from_holders_ += static_cast<std::int64_t>(r.size());
}

void RemoteHolders::relay_to_replicas() {
  std::vector<MPI_Request> reqs;
  for (auto& r : replies_) {
    if (r.empty()) continue;
    reqs.emplace_back();
    MPI_CHECK(MPI_Ibcast(r.data(), static_cast<int>(r.size()), MPI_BYTE, 0, layout_.dp_comm(),
                         &reqs.back()));
  }
  wait_all_quietly(static_cast<int>(reqs.size()), reqs.data());
}

UpdateInfo RemoteHolders::verify_and_deliver(std::int64_t version,
                                             const std::vector<std::vector<int>>& groups,
                                             const BlockSink& sink) {
  UpdateInfo info;
  for (int h = 0; h < static_cast<int>(groups.size()); ++h) {
    if (groups[h].empty()) continue;
    wire::ReplyHeader rh;
    std::memcpy(&rh, replies_[h].data(), sizeof(rh));
    PDT_CHECK(rh.version == version, "holder " + std::to_string(h) + " answered with version " +
                                         std::to_string(rh.version) + " for a fetch of version " +
                                         std::to_string(version));
    info = UpdateInfo{rh.version, rh.grad_norm, rh.lr};
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
      const std::size_t nb = static_cast<std::size_t>(d.numel) * 4;
      PDT_CHECK(crc32c(data, nb) == bh.crc,
                "CRC mismatch in block " + d.name + " (version " + std::to_string(version) +
                    ") fetched from holder " + std::to_string(h));
      sink(b, reinterpret_cast<const float*>(data));
      data += nb;
      fetched_ += static_cast<std::int64_t>(nb);
    }
  }
  return info;
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
    std::size_t bytes = head;
    for (int b : groups[h]) bytes += static_cast<std::size_t>(table_.blocks[b].numel) * 4;
    std::vector<char>& m = msgs.emplace_back(bytes);
    const wire::PushHeader ph{step, static_cast<std::int64_t>(groups[h].size())};
    std::memcpy(m.data(), &ph, sizeof(ph));
    char* data = m.data() + head;
    for (std::size_t i = 0; i < groups[h].size(); ++i) {
      const int b = groups[h][i];
      const std::size_t nb = static_cast<std::size_t>(table_.blocks[b].numel) * 4;
      const wire::BlockHeader bh{b, crc32c(where[b], nb), step};
      std::memcpy(m.data() + sizeof(ph) + i * sizeof(bh), &bh, sizeof(bh));
      std::memcpy(data, where[b], nb);
      data += nb;
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
