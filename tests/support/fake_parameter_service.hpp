#pragma once
// An in-memory ParameterService for the parameter cache's tests (tests/pd, tests/backend): block
// b of version v holds fake_block_value(v, b, i) = 1000 v + b + i / 1000, so a value names its
// block, version and element. It counts the fetches in flight; pushes are dropped.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "pdtrain/pd/parameter_service.hpp"

namespace pdtrain::test {

inline float fake_block_value(std::int64_t version, int block, std::int64_t i) {
  return static_cast<float>(1000 * version + block) + static_cast<float>(i) / 1000.0f;
}

class FakeService final : public ParameterService {
 public:
  // numel[b]: the size of block b.
  explicit FakeService(std::vector<std::int64_t> numel) : numel_(std::move(numel)) {}
  UpdateInfo fetch(std::int64_t version, const std::vector<int>& blocks,
                   const BlockSink& sink) override {
    for (int b : blocks) {
      std::vector<float> d(static_cast<std::size_t>(numel_[b]));
      for (std::size_t i = 0; i < d.size(); ++i)
        d[i] = fake_block_value(version, b, static_cast<std::int64_t>(i));
      sink(b, d.data());
    }
    return {version, 0, 0};
  }
  Ticket start_fetch(std::int64_t version, std::vector<int> blocks, BlockSink sink) override {
    started.push_back(blocks.front());
    ++in_flight;
    max_in_flight = std::max(max_in_flight, in_flight);
    return ParameterService::start_fetch(version, std::move(blocks), std::move(sink));
  }
  UpdateInfo finish_fetch(Ticket t) override {
    --in_flight;
    return ParameterService::finish_fetch(t);
  }
  std::optional<UpdateInfo> update_info(std::int64_t) const override { return std::nullopt; }
  void push(std::int64_t, const std::vector<int>&, const float*) override {}
  std::uint32_t finish_and_checksum() override { return 0; }
  std::int64_t bytes_fetched() const override { return 0; }
  std::int64_t bytes_pushed() const override { return 0; }

  std::vector<int> started;  // first block of each fetch started, in order
  int in_flight = 0, max_in_flight = 0;

 private:
  std::vector<std::int64_t> numel_;
};

}  // namespace pdtrain::test
