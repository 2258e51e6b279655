#pragma once
// The compute side of PD: fetches blocks from the holders that own them and pushes gradients
// to them, checking every block's version and CRC32C on arrival.
#include <vector>

#include "pdtrain/layout/layout.hpp"
#include "pdtrain/pd/blocks.hpp"

namespace pdtrain {

class RemoteHolders final : public ParameterService {
 public:
  RemoteHolders(const Layout& layout, const BlockTable& table, std::vector<int> owner);
  UpdateInfo fetch(std::int64_t version, const std::vector<int>& blocks,
                   const BlockSink& sink) override;
  void push(std::int64_t step, const std::vector<int>& blocks, const float* grads) override;
  std::uint32_t finish() override;
  std::int64_t bytes_fetched() const override { return fetched_; }
  std::int64_t bytes_pushed() const override { return pushed_; }

 private:
  // Block ids of `blocks` grouped by owning holder, keeping their order.
  std::vector<std::vector<int>> by_holder(const std::vector<int>& blocks) const;

  const Layout& layout_;
  const BlockTable& table_;
  std::vector<int> owner_;
  std::int64_t fetched_ = 0, pushed_ = 0;
  std::int64_t flip_at_version_ = -1;  // test hook, see the constructor
};

}  // namespace pdtrain
