#pragma once
// The compute side of PD: fetches blocks from the holders that own them and pushes gradients
// to them, checking every block's version and CRC32C on arrival.
#include <map>
#include <vector>

#include "pdtrain/layout/layout.hpp"
#include "pdtrain/pd/blocks.hpp"
#include "pdtrain/pd/wire_codec.hpp"

namespace pdtrain {

class RemoteHolders final : public ParameterService {
 public:
  RemoteHolders(const Layout& layout, const BlockTable& table, std::vector<int> owner,
                WireCodec fetch_codec, WireCodec push_codec);
  UpdateInfo fetch(std::int64_t version, const std::vector<int>& blocks,
                   const BlockSink& sink) override;
  void push(std::int64_t step, const std::vector<int>& blocks, const float* grads) override;
  std::uint32_t finish() override;
  std::optional<UpdateInfo> update_info(std::int64_t version) const override;
  bool holders_asked_to_stop() const override { return stop_; }
  std::int64_t bytes_fetched() const override { return fetched_; }
  // Bytes (encoded) this rank received from holders; the rest of bytes_fetched() came by relay.
  std::int64_t bytes_from_holders() const { return from_holders_; }
  std::int64_t bytes_pushed() const override { return pushed_; }

 private:
  // Block ids of `blocks` grouped by owning holder, keeping their order.
  std::vector<std::vector<int>> by_holder(const std::vector<int>& blocks) const;
  void fetch_from_holders(std::int64_t version, const std::vector<std::vector<int>>& groups);
  void relay_to_replicas();
  UpdateInfo verify_and_deliver(std::int64_t version, const std::vector<std::vector<int>>& groups,
                                const BlockSink& sink);

  const Layout& layout_;
  const BlockTable& table_;
  std::vector<int> owner_;
  WireCodec fetch_codec_, push_codec_;
  std::vector<std::vector<char>> replies_;  // one reply per holder, reused across steps
  std::vector<float> decoded_;              // one block, decoded
  std::map<std::int64_t, UpdateInfo> known_;  // updates learnt from reply headers
  bool stop_ = false;
  std::int64_t fetched_ = 0, pushed_ = 0, from_holders_ = 0;
  std::int64_t flip_at_version_ = -1;  // test hook, see the constructor
};

}  // namespace pdtrain
