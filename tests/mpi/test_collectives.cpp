// core/'s collectives under mpiexec: agreeing on an error and on a string.
// Run with 3 ranks: pdtrain_mpi_test(test_collectives 3).
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>

#include "pdtrain/core/agreement.hpp"

namespace pdtrain {
namespace {

int rank_of(MPI_Comm comm) {
  int r = 0;
  MPI_Comm_rank(comm, &r);
  return r;
}

TEST(Agreement, NoErrorAnywhereReturnsNormally) {
  EXPECT_NO_THROW(rethrow_collectively(MPI_COMM_WORLD, nullptr, ErrorScope::job));
  EXPECT_NO_THROW(run_collectively(MPI_COMM_WORLD, ErrorScope::group, [] {}));
}

TEST(Agreement, EveryRankThrowsTheLowestFailingRanksError) {
  const int me = rank_of(MPI_COMM_WORLD);
  // Ranks 1 and 2 fail with different errors; rank 0 does not.
  const Error mine(me == 1 ? ExitCode::data : ExitCode::layout, "rank " + std::to_string(me));
  try {
    rethrow_collectively(MPI_COMM_WORLD, me > 0 ? &mine : nullptr, ErrorScope::job);
    FAIL() << "expected an error on every rank";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::data);
    EXPECT_STREQ(e.what(), "rank 1");
    EXPECT_TRUE(e.collective());
  }
}

TEST(Agreement, AGroupsErrorIsNotMarkedCollective) {
  const int me = rank_of(MPI_COMM_WORLD);
  try {
    run_collectively(MPI_COMM_WORLD, ErrorScope::group, [&] {
      if (me == 2) throw Error(ExitCode::runtime, "disk full");
    });
    FAIL() << "expected an error on every rank";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::runtime);
    EXPECT_STREQ(e.what(), "disk full");
    EXPECT_FALSE(e.collective());
  }
}

TEST(Agreement, OneRankMakesNoMpiCall) {
  // MPI_COMM_SELF has one rank: the local error comes straight back, in either scope.
  const Error local(ExitCode::deck, "bad key");
  try {
    rethrow_collectively(MPI_COMM_SELF, &local, ErrorScope::job);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "bad key");
    EXPECT_TRUE(e.collective());
  }
  EXPECT_NO_THROW(rethrow_collectively(MPI_COMM_SELF, nullptr, ErrorScope::group));
}

TEST(Agreement, BroadcastStringFromAnyRoot) {
  const int me = rank_of(MPI_COMM_WORLD);
  std::string s = me == 2 ? std::string(100000, 'x') + "end" : "short";
  broadcast_string(MPI_COMM_WORLD, s, 2);
  EXPECT_EQ(s.size(), 100003u);
  EXPECT_EQ(s.substr(s.size() - 3), "end");
}

}  // namespace
}  // namespace pdtrain
