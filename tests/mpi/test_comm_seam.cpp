// The collectives seam (core/collectives.hpp) over MPI, at any rank count (registered for 1, 2,
// 3 and 4 ranks): sums bit-identical on every rank and equal to the fixed-order reference
// (rank order 0..n-1), max, the reduce of parameter units of uneven sizes and its gather, and
// point-to-point groups (a ring where every rank sends before it receives, messages matched by
// tag whatever the posting order, and the pipeline executor's paired 1F1B over it).
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "pdtrain/core/collectives.hpp"
#include "pdtrain/core/counts.hpp"
#include "pdtrain/core/mpi_check.hpp"
#include "pdtrain/core/mpi_collectives.hpp"
#include "pdtrain/schedule/pipeline_executor.hpp"

namespace pdtrain {
namespace {

int me() { return comm_rank(MPI_COMM_WORLD); }
int ranks() { return comm_size(MPI_COMM_WORLD); }

// Rank r's copy of element i: ranks 0 and 1 nearly cancel, so a sum in any other order than
// rank order loses the later ranks' small values; rank order is the reference.
float value(int r, std::int64_t i) {
  const float big = 1e8f * static_cast<float>(1 + i % 3);
  if (r == 0) return big;
  if (r == 1) return -big;
  return 1.5f + 0.25f * static_cast<float>(i) + 0.125f * static_cast<float>(r);
}

float rank_order_sum(std::int64_t i) {
  float s = value(0, i);
  for (int r = 1; r < ranks(); ++r) s += value(r, i);
  return s;
}

std::vector<float> my_copy(std::int64_t n) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[i] = value(me(), i);
  return v;
}

// Whether every rank holds exactly these bits.
bool same_bits_everywhere(const std::vector<float>& data) {
  std::vector<float> first = data;
  MPI_CHECK(MPI_Bcast(first.data(), static_cast<int>(first.size()), MPI_FLOAT, 0, MPI_COMM_WORLD));
  int same = std::memcmp(first.data(), data.data(), data.size() * sizeof(float)) == 0, all = 0;
  MPI_CHECK(MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  return all == 1;
}

TEST(CommSeam, MpiIsTheTransportAndTheGroupIsTheCommunicator) {
  MpiCollectives c(MPI_COMM_WORLD);
  EXPECT_STREQ(c.transport(), "mpi");
  EXPECT_EQ(c.rank(), me());
  EXPECT_EQ(c.size(), ranks());
}

TEST(CommSeam, AllreduceSumIsTheRankOrderSumOnEveryRank) {
  MpiCollectives c(MPI_COMM_WORLD);
  Collectives& seam = c;
  for (std::int64_t n : {std::int64_t{0}, std::int64_t{1}, std::int64_t{3}, std::int64_t{1001}}) {
    std::vector<float> data = my_copy(n);
    seam.allreduce_sum(data.data(), n);
    for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(data[i], rank_order_sum(i)) << "n " << n << " element " << i;
    EXPECT_TRUE(same_bits_everywhere(data)) << "n " << n;
  }
}

TEST(CommSeam, AllreduceSumIsTheSameInPiecesOfAnySize) {
  // Segments cut into messages of 1 and 2 floats (as segments above INT_MAX floats are).
  for (std::int64_t piece : {std::int64_t{1}, std::int64_t{2}}) {
    MpiCollectives c(MPI_COMM_WORLD, piece);
    std::vector<float> data = my_copy(37);
    c.allreduce_sum(data.data(), 37);
    for (std::int64_t i = 0; i < 37; ++i) ASSERT_EQ(data[i], rank_order_sum(i)) << i;
  }
}

TEST(CommSeam, AllreduceMaxOnEveryRank) {
  MpiCollectives c(MPI_COMM_WORLD);
  const std::int64_t n = 64;
  std::vector<float> data(n);
  for (std::int64_t i = 0; i < n; ++i)
    data[i] = static_cast<float>((i * 7 + me() * 13) % 29) - 14.5f;
  c.allreduce_max(data.data(), n);
  for (std::int64_t i = 0; i < n; ++i) {
    float want = -1e30f;
    for (int r = 0; r < ranks(); ++r)
      want = std::max(want, static_cast<float>((i * 7 + r * 13) % 29) - 14.5f);
    ASSERT_EQ(data[i], want) << i;
  }
  EXPECT_TRUE(same_bits_everywhere(data));
}

TEST(CommSeam, ReduceOfUnitsOfUnevenSizesThenGather) {
  // Segments as the gradient reducer cuts units: uneven, one possibly empty.
  const int n = ranks();
  std::vector<std::int64_t> counts(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) counts[r] = (r == 1 ? 0 : 3 + 5 * r);
  const std::vector<std::int64_t> starts = displacements(counts);
  const std::int64_t total = starts.back() + counts.back();
  MpiCollectives c(MPI_COMM_WORLD);
  const std::vector<float> data = my_copy(total);
  for (int unit = 0; unit < 3; ++unit) {  // consecutive units never mix their messages
    const float* mine = c.reduce_scatter(data.data(), counts);
    for (std::int64_t i = 0; i < counts[me()]; ++i)
      ASSERT_EQ(mine[i], rank_order_sum(starts[me()] + i)) << "unit " << unit << " element " << i;
    std::vector<float> all(static_cast<std::size_t>(total), -1.0f);
    c.allgather(mine, all.data(), counts);
    for (std::int64_t i = 0; i < total; ++i) ASSERT_EQ(all[i], rank_order_sum(i)) << i;
    EXPECT_TRUE(same_bits_everywhere(all));
  }
}

TEST(CommSeam, RingOfSendsBeforeReceivesInOneGroup) {
  // Every rank sends to the next before it receives from the previous: one group each, so
  // nobody waits for a receive that is posted only after its own send completes.
  MpiCollectives c(MPI_COMM_WORLD);
  const int n = ranks(), next = (me() + 1) % n, prev = (me() + n - 1) % n;
  const std::vector<float> out = my_copy(100000);  // large: a rendezvous send on most transports
  std::vector<float> in(out.size(), 0.0f);
  c.send(out.data(), static_cast<std::int64_t>(out.size()), next, 7);
  c.recv(in.data(), static_cast<std::int64_t>(in.size()), prev, 7);
  c.end_group();
  for (std::size_t i = 0; i < in.size(); i += 997) ASSERT_EQ(in[i], value(prev, static_cast<std::int64_t>(i)));
  c.finish_sends();
}

TEST(CommSeam, MessagesMatchTheirTagsWhateverThePostingOrder) {
  if (ranks() < 2) GTEST_SKIP() << "needs a partner";
  MpiCollectives c(MPI_COMM_WORLD);
  float a = 1.0f, b = 2.0f, got_a = 0.0f, got_b = 0.0f;
  if (me() == 0) {
    c.send(&a, 1, 1, 11);
    c.send(&b, 1, 1, 12);
    c.end_group();
    c.finish_sends();
  } else if (me() == 1) {
    c.recv(&got_b, 1, 0, 12);  // posted first, matched by tag
    c.recv(&got_a, 1, 0, 11);
    c.end_group();
    EXPECT_EQ(got_a, 1.0f);
    EXPECT_EQ(got_b, 2.0f);
  }
}

// A stage that adds its stage number + 1 to what it receives, forward, and doubles the gradient
// backward: after the step, each micro-batch's values say which stages touched them in order.
class AddingStage final : public PipelineStageOps {
 public:
  AddingStage(int stage, int micro_batches, std::int64_t n)
      : stage_(stage), n_(n), out_(static_cast<std::size_t>(micro_batches),
                                   std::vector<float>(static_cast<std::size_t>(n))),
        din_(static_cast<std::size_t>(n)) {}
  void forward(int mb, const float* input) override {
    for (std::int64_t i = 0; i < n_; ++i)
      out_[mb][i] = (input ? input[i] : static_cast<float>(mb * 1000 + i)) + static_cast<float>(stage_ + 1);
  }
  const float* output(int mb) override { return out_[mb].data(); }
  void backward(int mb, const float* doutput) override {
    for (std::int64_t i = 0; i < n_; ++i) din_[i] = doutput ? 2.0f * doutput[i] : out_[mb][i];
    last_dinput_.push_back(din_[0]);
  }
  const float* dinput() override { return din_.data(); }
  std::vector<float> last_dinput_;  // element 0 of each backward's d(input), in order

 private:
  int stage_;
  std::int64_t n_;
  std::vector<std::vector<float>> out_;
  std::vector<float> din_;
};

TEST(CommSeam, PipelineExecutorRunsPairedOneFOneBOverTheSeam) {
  // Every rank a stage of one pipeline, 1F1B with more micro-batches than stages, so every
  // stage has a warm-up, a steady state of paired groups and a cool-down.
  MpiCollectives stages(MPI_COMM_WORLD);
  const int m = 5, p = ranks();
  const std::int64_t n = 4096;
  for (PipelineKind kind : {PipelineKind::one_f_one_b, PipelineKind::gpipe}) {
    PipelineExecutor exec(stages, kind, m, n, nullptr);
    AddingStage stage(me(), m, n);
    exec.run_step(stage);
    ASSERT_EQ(stage.last_dinput_.size(), static_cast<std::size_t>(m));
    // The last stage's output of mb is mb*1000 + sum(1..p); its gradient doubles per stage down.
    for (int mb = 0; mb < m; ++mb) {
      const float last_out = static_cast<float>(mb * 1000 + p * (p + 1) / 2);
      float want = last_out;
      for (int s = p - 1; s > me(); --s) want *= 2.0f;
      EXPECT_EQ(stage.last_dinput_[mb], want) << to_string(kind) << " mb " << mb;
    }
  }
}

}  // namespace
}  // namespace pdtrain
