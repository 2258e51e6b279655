// fill_initial_values: the blocks' initial values do not depend on how many threads fill them,
// and an error from one block reaches the caller.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "pdtrain/pd/blocks.hpp"

namespace pdtrain {
namespace {

// A value per block and element, as a catalogue's init gives (deterministic, position-keyed).
float value_of(int id, std::int64_t i) { return static_cast<float>(id * 1000003 + i * 7919 % 10007) * 1e-3f; }

// 40 blocks of assorted sizes, filled on `threads` threads.
std::vector<std::vector<float>> filled(int threads) {
  BlockTable table;
  for (int b = 0; b < 40; ++b) table.blocks.push_back(BlockDesc{1 + (b * 37) % 500, false, "", 0});
  table.init = [](int id, float* out) {
    for (std::int64_t i = 0; i < 1 + (id * 37) % 500; ++i) out[i] = value_of(id, i);
  };
  table.init_threads = threads;
  std::vector<std::vector<float>> values(table.blocks.size());
  std::vector<std::pair<int, float*>> blocks;
  for (int b = 39; b >= 0; --b) {  // any order
    values[b].assign(static_cast<std::size_t>(table.blocks[b].numel), -1.0f);
    blocks.emplace_back(b, values[b].data());
  }
  fill_initial_values(table, blocks);
  return values;
}

TEST(InitialValues, AreTheSameOnAnyNumberOfThreads) {
  const auto one = filled(1);
  for (std::size_t b = 0; b < one.size(); ++b)
    for (std::size_t i = 0; i < one[b].size(); ++i)
      ASSERT_EQ(one[b][i], value_of(static_cast<int>(b), static_cast<std::int64_t>(i)));
  for (int threads : {2, 3, 8}) {
    const auto many = filled(threads);
    for (std::size_t b = 0; b < one.size(); ++b)
      ASSERT_EQ(one[b], many[b]) << "block " << b << " on " << threads << " threads";
  }
}

TEST(InitialValues, AnErrorFromAnyBlockReachesTheCaller) {
  for (int bad : {0, 5}) {
    BlockTable table;
    table.blocks.resize(9, BlockDesc{4, false, "", 0});
    table.init = [bad](int id, float* out) {
      if (id == bad) throw std::runtime_error("block " + std::to_string(id) + " unreadable");
      std::fill(out, out + 4, 1.0f);
    };
    table.init_threads = 4;
    std::vector<std::vector<float>> values(9, std::vector<float>(4));
    std::vector<std::pair<int, float*>> blocks;
    for (int b = 0; b < 9; ++b) blocks.emplace_back(b, values[b].data());
    try {
      fill_initial_values(table, blocks);
      ADD_FAILURE() << "no error from block " << bad;
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(std::string(e.what()), "block " + std::to_string(bad) + " unreadable");
    }
  }
}

}  // namespace
}  // namespace pdtrain
