// The collectives of core/ under mpiexec: agreeing on an error and on a string, and the
// fixed-order reduction (with messages cut into pieces of a few floats, as segments above
// INT_MAX floats are) under its two users, the tensor-parallel group and the gradient reducer.
// Run with 3 ranks: pdtrain_mpi_test(test_collectives 3).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "pdtrain/core/agreement.hpp"
#include "pdtrain/core/counts.hpp"
#include "pdtrain/core/fixed_order_reduce.hpp"
#include "pdtrain/core/mpi_check.hpp"
#include "pdtrain/core/mpi_collectives.hpp"
#include "pdtrain/schedule/grad_reduce.hpp"

namespace pdtrain {
namespace {

TEST(Agreement, NoErrorAnywhereReturnsNormally) {
  EXPECT_NO_THROW(rethrow_collectively(MPI_COMM_WORLD, nullptr, ErrorScope::job));
  EXPECT_NO_THROW(run_collectively(MPI_COMM_WORLD, ErrorScope::group, [] {}));
}

// Runs `agree`, which must throw on every rank, and checks the error this rank got.
template <class Agree>
void expect_error_everywhere(Agree&& agree, ExitCode code, const char* what, bool collective) {
  try {
    agree();
    FAIL() << "expected an error on every rank";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code);
    EXPECT_STREQ(e.what(), what);
    EXPECT_EQ(e.collective(), collective);
  }
}

TEST(Agreement, EveryRankThrowsTheLowestFailingRanksError) {
  const int me = comm_rank(MPI_COMM_WORLD);
  // Ranks 1 and 2 fail with different errors; rank 0 does not.
  const Error mine(me == 1 ? ExitCode::data : ExitCode::layout, "rank " + std::to_string(me));
  expect_error_everywhere(
      [&] { rethrow_collectively(MPI_COMM_WORLD, me > 0 ? &mine : nullptr, ErrorScope::job); },
      ExitCode::data, "rank 1", true);
}

TEST(Agreement, AGroupsErrorIsNotMarkedCollective) {
  const int me = comm_rank(MPI_COMM_WORLD);
  expect_error_everywhere(
      [&] {
        run_collectively(MPI_COMM_WORLD, ErrorScope::group, [&] {
          if (me == 2) throw Error(ExitCode::runtime, "disk full");
        });
      },
      ExitCode::runtime, "disk full", false);
}

TEST(Agreement, OneRankMakesNoMpiCall) {
  // MPI_COMM_SELF has one rank: the local error comes straight back, in either scope.
  const Error local(ExitCode::deck, "bad key");
  expect_error_everywhere([&] { rethrow_collectively(MPI_COMM_SELF, &local, ErrorScope::job); },
                          ExitCode::deck, "bad key", true);
  expect_error_everywhere([&] { rethrow_collectively(MPI_COMM_SELF, &local, ErrorScope::group); },
                          ExitCode::deck, "bad key", false);
  EXPECT_NO_THROW(rethrow_collectively(MPI_COMM_SELF, nullptr, ErrorScope::group));
}

TEST(Agreement, BroadcastStringFromAnyRoot) {
  const int me = comm_rank(MPI_COMM_WORLD);
  std::string s = me == 2 ? std::string(100000, 'x') + "end" : "short";
  broadcast_string(MPI_COMM_WORLD, s, 2);
  EXPECT_EQ(s.size(), 100003u);
  EXPECT_EQ(s.substr(s.size() - 3), "end");
}

// Rank r's copy of element i. Ranks 0 and 1 nearly cancel, so the sum depends on the order
// of the additions: (x0 + x1) + x2 keeps rank 2's small value, other orders lose it.
float value(int r, std::int64_t i) {
  const float big = 1e8f * static_cast<float>(1 + i % 3);
  return r == 0 ? big : r == 1 ? -big : 1.5f + 0.25f * static_cast<float>(i);
}

float sum_in_rank_order(std::int64_t i, int ranks) {
  float s = value(0, i);
  for (int r = 1; r < ranks; ++r) s += value(r, i);
  return s;
}

std::vector<float> my_copy(std::int64_t n) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[i] = value(comm_rank(MPI_COMM_WORLD), i);
  return v;
}

TEST(FixedOrderReducer, TheTestDataDependsOnTheOrderOfAdditions) {
  EXPECT_NE(sum_in_rank_order(0, 3), (value(2, 0) + value(1, 0)) + value(0, 0));
  EXPECT_NE(sum_in_rank_order(0, 3), value(0, 0) + (value(1, 0) + value(2, 0)));
}

TEST(FixedOrderReducer, ReduceScatterAddsEverySegmentInRankOrder) {
  const std::vector<std::int64_t> counts = {5, 0, 7};  // rank 1's segment is empty
  const std::vector<std::int64_t> starts = displacements(counts);
  const std::vector<float> data = my_copy(12);
  const int me = comm_rank(MPI_COMM_WORLD);
  for (std::int64_t max_message : {std::int64_t{1}, std::int64_t{2}, FixedOrderReducer::kMaxMessageFloats}) {
    FixedOrderReducer reducer(MPI_COMM_WORLD, max_message);
    for (int call = 0; call < 2; ++call) {  // the next call's messages never mix with these
      const float* sum = reducer.reduce_scatter(data.data(), counts);
      for (std::int64_t i = 0; i < counts[me]; ++i)
        EXPECT_EQ(sum[i], sum_in_rank_order(starts[me] + i, 3))
            << "element " << starts[me] + i << ", pieces of " << max_message;
    }
  }
}

TEST(FixedOrderReducer, AllgatherPutsEverySegmentInItsPlace) {
  const std::vector<std::int64_t> counts = {3, 6, 0};
  const std::vector<std::int64_t> starts = displacements(counts);
  const int me = comm_rank(MPI_COMM_WORLD);
  std::vector<float> segment(static_cast<std::size_t>(counts[me]));
  for (std::int64_t i = 0; i < counts[me]; ++i) segment[i] = value(me, starts[me] + i);
  FixedOrderReducer reducer(MPI_COMM_WORLD, 4);
  std::vector<float> out(9, -1.0f);
  reducer.allgather(segment.data(), out.data(), counts);
  for (int r = 0; r < 3; ++r)
    for (std::int64_t i = starts[r]; i < starts[r] + counts[r]; ++i)
      EXPECT_EQ(out[i], value(r, i)) << "element " << i;
}

TEST(FixedOrderReducer, TensorParallelAllreduceGivesEveryRankTheRankOrderSum) {
  MpiCollectives tp(MPI_COMM_WORLD);
  for (std::int64_t n : {1000, 2, 0}) {  // n = 2: a rank with an empty segment
    std::vector<float> data = my_copy(n);
    tp.allreduce_sum(data.data(), n);
    for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(data[i], sum_in_rank_order(i, 3)) << i;
  }
}

TEST(GradReducer, SegmentsByBlockReducedInReplicaOrderThenGathered) {
  const std::vector<int> blocks = {10, 20, 30, 40};
  const std::vector<std::int64_t> numel = {4, 9, 6, 5};
  GradReducer reducer(MPI_COMM_WORLD, blocks, numel);
  ASSERT_EQ(reducer.total_numel(), 24);
  const std::vector<float> packed = my_copy(24);
  const float* mine = reducer.reduce_scatter(packed.data());
  // This replica's segment: its blocks, contiguous in blocks() order.
  std::int64_t start = 0;
  for (std::size_t b = 0; b < blocks.size() && blocks[b] != reducer.my_blocks().front(); ++b)
    start += numel[b];
  for (std::int64_t i = 0; i < reducer.my_numel(); ++i)
    EXPECT_EQ(mine[i], sum_in_rank_order(start + i, 3)) << "element " << start + i;
  std::vector<float> all(24, 0.0f);
  reducer.allgather(mine, all.data());
  for (std::int64_t i = 0; i < 24; ++i) EXPECT_EQ(all[i], sum_in_rank_order(i, 3)) << i;
  int owned = static_cast<int>(reducer.my_blocks().size()), total = 0;
  MPI_Allreduce(&owned, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(total, 4);  // every block reduced by exactly one replica
  EXPECT_EQ(reducer.sum(comm_rank(MPI_COMM_WORLD) + 0.5), 4.5);
}

}  // namespace
}  // namespace pdtrain
