// Pipeline schedules: exact action lists for small cases written out by hand, the structural
// rules every list must keep (each forward/backward once, forward before backward, sends and
// receives pairing up between neighbours), deadlock freedom and timing in the simulator, a
// deliberately broken ordering the simulator must call a deadlock, and message tags.
#include <gtest/gtest.h>

#include <cctype>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "pdtrain/schedule/pipeline_schedule.hpp"

namespace pdtrain {
namespace {

using Lists = std::vector<std::vector<PipelineAction>>;
constexpr PipelineKind kGpipe = PipelineKind::gpipe;
constexpr PipelineKind k1f1b = PipelineKind::one_f_one_b;
constexpr PipelineKind kKinds[] = {kGpipe, k1f1b};

// A list in a short notation, so expected lists read like the schedule diagrams:
// ra = recv_activation, F = forward, sa = send_activation, rg = recv_grad, B = backward,
// sg = send_grad, each followed by the micro-batch ("ra0 F0 sa0 ..."); a "+" after an action
// groups it with the next one ("sa1+ rg0": posted together, see pair_messages).
std::string notation(const std::vector<PipelineAction>& list) {
  static const char* const kShort[] = {"ra", "F", "sa", "rg", "B", "sg"};
  std::ostringstream os;
  for (std::size_t k = 0; k < list.size(); ++k)
    os << (k ? " " : "") << kShort[static_cast<int>(list[k].kind)] << list[k].micro_batch
       << (list[k].grouped_with_next ? "+" : "");
  return os.str();
}

std::string actions(PipelineKind kind, int stages, int stage, int m) {
  return notation(pipeline_actions(kind, stages, stage, m));
}

// The inverse of notation(), to build hand-made (and broken) lists for the simulator.
std::vector<PipelineAction> parse(const std::string& text) {
  static const std::pair<const char*, ActionKind> kShort[] = {
      {"ra", ActionKind::recv_activation}, {"sa", ActionKind::send_activation},
      {"rg", ActionKind::recv_grad},       {"sg", ActionKind::send_grad},
      {"F", ActionKind::forward},          {"B", ActionKind::backward}};
  std::vector<PipelineAction> out;
  std::istringstream is(text);
  for (std::string tok; is >> tok;) {
    bool found = false;
    for (const auto& [name, kind] : kShort) {
      const std::string n = name;
      if (tok.rfind(n, 0) == 0 && tok.size() > n.size() &&
          std::isdigit(static_cast<unsigned char>(tok[n.size()]))) {
        out.push_back({kind, std::stoi(tok.substr(n.size())), tok.back() == '+'});
        found = true;
        break;
      }
    }
    if (!found) ADD_FAILURE() << "bad token " << tok;
  }
  return out;
}

// ---- exact lists ------------------------------------------------------------------------

TEST(PipelineActions, OneFOneBTwoStagesThreeMicroBatches) {
  // Stage 0 warms up with one forward so stage 1 (the last) can backward right after its own
  // forward; the last stage never warms up.
  EXPECT_EQ(actions(k1f1b, 2, 0, 3), "F0 sa0 F1 sa1 rg0 B0 F2 sa2 rg1 B1 rg2 B2");
  EXPECT_EQ(actions(k1f1b, 2, 1, 3), "ra0 F0 B0 sg0 ra1 F1 B1 sg1 ra2 F2 B2 sg2");
}

TEST(PipelineActions, OneFOneBFourStagesFourMicroBatches) {
  // Warmup p-s-1 = 3, 2, 1, 0 forwards; then forward(i+warmup) / backward(i); then cooldown.
  EXPECT_EQ(actions(k1f1b, 4, 0, 4), "F0 sa0 F1 sa1 F2 sa2 F3 sa3 rg0 B0 rg1 B1 rg2 B2 rg3 B3");
  EXPECT_EQ(actions(k1f1b, 4, 1, 4),
            "ra0 F0 sa0 ra1 F1 sa1 ra2 F2 sa2 rg0 B0 sg0 ra3 F3 sa3 rg1 B1 sg1 "
            "rg2 B2 sg2 rg3 B3 sg3");
  EXPECT_EQ(actions(k1f1b, 4, 2, 4),
            "ra0 F0 sa0 ra1 F1 sa1 rg0 B0 sg0 ra2 F2 sa2 rg1 B1 sg1 ra3 F3 sa3 rg2 B2 sg2 "
            "rg3 B3 sg3");
  EXPECT_EQ(actions(k1f1b, 4, 3, 4), "ra0 F0 B0 sg0 ra1 F1 B1 sg1 ra2 F2 B2 sg2 ra3 F3 B3 sg3");
}

TEST(PipelineActions, OneFOneBFewerMicroBatchesThanStages) {
  // Warmup is capped at m: stage 0 of 4 with 2 micro-batches forwards both, then backwards.
  EXPECT_EQ(actions(k1f1b, 4, 0, 2), "F0 sa0 F1 sa1 rg0 B0 rg1 B1");
  // Stage 2 warms up with min(1, 2) = 1 forward, has one steady pair (F1 B0), then cools down.
  EXPECT_EQ(actions(k1f1b, 4, 2, 2), "ra0 F0 sa0 ra1 F1 sa1 rg0 B0 sg0 rg1 B1 sg1");
  EXPECT_EQ(actions(k1f1b, 4, 3, 2), "ra0 F0 B0 sg0 ra1 F1 B1 sg1");
  EXPECT_EQ(pipeline_in_flight(k1f1b, 4, 0, 2), 2);
}

TEST(PipelineActions, GpipeTwoStagesTwoMicroBatches) {
  // All forwards, then all backwards in micro-batch order 0..m-1.
  EXPECT_EQ(actions(kGpipe, 2, 0, 2), "F0 sa0 F1 sa1 rg0 B0 rg1 B1");
  EXPECT_EQ(actions(kGpipe, 2, 1, 2), "ra0 F0 ra1 F1 B0 sg0 B1 sg1");
}

TEST(PipelineActions, SingleStageHasNoMessages) {
  EXPECT_EQ(actions(k1f1b, 1, 0, 3), "F0 B0 F1 B1 F2 B2");
  EXPECT_EQ(actions(kGpipe, 1, 0, 3), "F0 F1 F2 B0 B1 B2");
}

TEST(PipelineActions, RejectsBadShapes) {
  for (PipelineKind k : kKinds) {
    EXPECT_THROW(pipeline_actions(k, 0, 0, 1), std::invalid_argument);
    EXPECT_THROW(pipeline_actions(k, 2, 0, 0), std::invalid_argument);
    EXPECT_THROW(pipeline_actions(k, 2, 2, 1), std::invalid_argument);
    EXPECT_THROW(pipeline_actions(k, 2, -1, 1), std::invalid_argument);
    EXPECT_THROW(pipeline_in_flight(k, 2, 2, 1), std::invalid_argument);
  }
  EXPECT_THROW(simulate_pipeline(k1f1b, 2, 0), std::invalid_argument);
  EXPECT_THROW(ideal_bubble_fraction(0, 4), std::invalid_argument);
}

TEST(PipelineKind, FromString) {
  EXPECT_EQ(pipeline_kind_from_string("gpipe"), kGpipe);
  EXPECT_EQ(pipeline_kind_from_string("1f1b"), k1f1b);
  EXPECT_EQ(pipeline_kind_from_string("1F1B"), std::nullopt);
  EXPECT_EQ(pipeline_kind_from_string(""), std::nullopt);
  for (PipelineKind k : kKinds) EXPECT_EQ(pipeline_kind_from_string(to_string(k)), k);
}

// ---- structural rules over many shapes --------------------------------------------------

// Position of action (kind, mb) in `list`, or -1.
int find(const std::vector<PipelineAction>& list, ActionKind kind, int mb) {
  for (std::size_t k = 0; k < list.size(); ++k)
    if (list[k] == PipelineAction{kind, mb}) return static_cast<int>(k);
  return -1;
}

// The micro-batches of the actions of one kind, in list order.
std::vector<int> of_kind(const std::vector<PipelineAction>& list, ActionKind kind) {
  std::vector<int> out;
  for (const auto& a : list)
    if (a.kind == kind) out.push_back(a.micro_batch);
  return out;
}

TEST(PipelineActions, StructuralRulesForAllShapes) {
  for (PipelineKind kind : kKinds)
    for (int p = 1; p <= 8; ++p)
      for (int m = 1; m <= 16; ++m) {
        SCOPED_TRACE(std::string(to_string(kind)) + " stages " + std::to_string(p) + " m " +
                     std::to_string(m));
        std::vector<int> in_order(m);
        for (int i = 0; i < m; ++i) in_order[i] = i;
        Lists lists;
        for (int s = 0; s < p; ++s) lists.push_back(pipeline_actions(kind, p, s, m));
        for (int s = 0; s < p; ++s) {
          const auto& l = lists[s];
          const bool first = s == 0, last = s == p - 1;
          // Forwards and backwards: each micro-batch once, both in order 0..m-1.
          EXPECT_EQ(of_kind(l, ActionKind::forward), in_order) << "stage " << s;
          EXPECT_EQ(of_kind(l, ActionKind::backward), in_order) << "stage " << s;
          // Messages exist exactly where a neighbour does, once per micro-batch.
          EXPECT_EQ(of_kind(l, ActionKind::recv_activation), first ? std::vector<int>{} : in_order);
          EXPECT_EQ(of_kind(l, ActionKind::send_activation), last ? std::vector<int>{} : in_order);
          EXPECT_EQ(of_kind(l, ActionKind::recv_grad), last ? std::vector<int>{} : in_order);
          EXPECT_EQ(of_kind(l, ActionKind::send_grad), first ? std::vector<int>{} : in_order);
          EXPECT_EQ(l.size(), static_cast<std::size_t>(m) * (2 + 2 * !first + 2 * !last));
          for (int i = 0; i < m; ++i) {
            const int f = find(l, ActionKind::forward, i), b = find(l, ActionKind::backward, i);
            EXPECT_LT(f, b) << "stage " << s << " backward before forward of " << i;
            // Each receive comes right before its compute, each send right after.
            if (!first) {
              EXPECT_EQ(find(l, ActionKind::recv_activation, i), f - 1);
              EXPECT_EQ(find(l, ActionKind::send_grad, i), b + 1);
            }
            if (!last) {
              EXPECT_EQ(find(l, ActionKind::send_activation, i), f + 1);
              EXPECT_EQ(find(l, ActionKind::recv_grad, i), b - 1);
            }
          }
        }
        // Neighbours agree on the order of the messages between them (so FIFO channels and
        // tags-per-micro-batch both deliver the right message).
        for (int s = 0; s + 1 < p; ++s) {
          EXPECT_EQ(of_kind(lists[s], ActionKind::send_activation),
                    of_kind(lists[s + 1], ActionKind::recv_activation));
          EXPECT_EQ(of_kind(lists[s + 1], ActionKind::send_grad),
                    of_kind(lists[s], ActionKind::recv_grad));
        }
      }
}

// ---- simulation -------------------------------------------------------------------------

TEST(PipelineSimulation, CompletesWithExpectedMemoryAndTime) {
  // Both are flush schedules with uniform stage times, so each takes (m+p-1)(tf+tb): the
  // first micro-batch's forward ripples through p stages, the last one's backward back.
  // Every stage computes m(tf+tb), so every stage's idle fraction is exactly the ideal bubble.
  for (double tb : {1.0, 2.0, 3.0})
    for (PipelineKind kind : kKinds)
      for (int p = 1; p <= 8; ++p)
        for (int m = 1; m <= 16; ++m) {
          SCOPED_TRACE(std::string(to_string(kind)) + " stages " + std::to_string(p) + " m " +
                       std::to_string(m) + " t_backward " + std::to_string(tb));
          const PipelineSimulation r = simulate_pipeline(kind, p, m, 1.0, tb);
          ASSERT_TRUE(r.completed) << r.deadlock_report;
          EXPECT_EQ(r.deadlock_report, "");
          EXPECT_DOUBLE_EQ(r.makespan, (m + p - 1) * (1.0 + tb));
          ASSERT_EQ(r.idle_fraction.size(), static_cast<std::size_t>(p));
          ASSERT_EQ(r.max_in_flight.size(), static_cast<std::size_t>(p));
          for (int s = 0; s < p; ++s) {
            EXPECT_NEAR(r.idle_fraction[s], ideal_bubble_fraction(p, m), 1e-12) << "stage " << s;
            // The slot count is exactly what the schedule needs: never exceeded (else the
            // executor would overwrite live activations) and reached (else memory is wasted).
            EXPECT_EQ(r.max_in_flight[s], pipeline_in_flight(kind, p, s, m)) << "stage " << s;
          }
          if (kind == kGpipe) {
            EXPECT_EQ(r.max_in_flight[0], m);
          }
        }
}

TEST(PipelineSimulation, SameMakespanBothKinds) {
  // 1F1B saves activation memory, not time: in this model its bubble equals GPipe's.
  for (int p : {2, 4, 8})
    for (int m : {1, 3, 8, 32}) {
      EXPECT_DOUBLE_EQ(simulate_pipeline(k1f1b, p, m).makespan,
                       simulate_pipeline(kGpipe, p, m).makespan)
          << "stages " << p << " m " << m;
    }
}

TEST(PipelineSimulation, BubbleApproachesIdealAndShrinksWithMicroBatches) {
  // With t_backward = 2 t_forward (the default), stage 0's idle fraction is the textbook
  // (p-1)/(m+p-1); e.g. 4 stages, 64 micro-batches: 3/67.
  const PipelineSimulation r = simulate_pipeline(k1f1b, 4, 64);
  ASSERT_TRUE(r.completed);
  EXPECT_NEAR(ideal_bubble_fraction(4, 64), 3.0 / 67.0, 1e-15);
  EXPECT_NEAR(r.idle_fraction[0], 3.0 / 67.0, 1e-9);
  EXPECT_LT(simulate_pipeline(k1f1b, 4, 64).idle_fraction[0],
            simulate_pipeline(k1f1b, 4, 8).idle_fraction[0]);
  EXPECT_DOUBLE_EQ(ideal_bubble_fraction(1, 5), 0.0);
}

TEST(PipelineSimulation, HandComputedTiming) {
  // Two stages, one micro-batch, tf = 1, tb = 2: stage 0 forwards [0,1], stage 1 forwards
  // [1,2] and backwards [2,4], stage 0 backwards [4,6]. Each is busy 3 of 6.
  const PipelineSimulation r =
      simulate_lists({parse("F0 sa0 rg0 B0"), parse("ra0 F0 B0 sg0")}, 1.0, 2.0);
  ASSERT_TRUE(r.completed);
  EXPECT_DOUBLE_EQ(r.makespan, 6.0);
  EXPECT_DOUBLE_EQ(r.idle_fraction[0], 0.5);
  EXPECT_DOUBLE_EQ(r.idle_fraction[1], 0.5);
  EXPECT_EQ(r.max_in_flight, (std::vector<int>{1, 1}));
}

TEST(PipelineSimulation, ReportsDeadlock) {
  // Stage 1 of 3 waits for micro-batch 0's gradient before it sends micro-batch 0's activation
  // on, so stage 2 never gets the activation, never runs its forward, and never sends the
  // gradient: both wait forever. Stage 0 also waits (on the gradient stage 1 never sends).
  const PipelineSimulation r = simulate_lists(
      {parse("F0 sa0 rg0 B0"), parse("ra0 F0 rg0 B0 sg0 sa0"), parse("ra0 F0 B0 sg0")});
  EXPECT_FALSE(r.completed);
  EXPECT_NE(r.deadlock_report.find("stage 0 waits forever at action 2 recv_grad(0)"),
            std::string::npos)
      << r.deadlock_report;
  EXPECT_NE(r.deadlock_report.find("stage 1 waits forever at action 2 recv_grad(0)"),
            std::string::npos)
      << r.deadlock_report;
  EXPECT_NE(r.deadlock_report.find("stage 2 waits forever at action 0 recv_activation(0)"),
            std::string::npos)
      << r.deadlock_report;

  // Two stages each receiving before sending what the other waits for.
  const PipelineSimulation r2 = simulate_lists({parse("rg0 B0 F0 sa0"), parse("ra0 F0 B0 sg0")});
  EXPECT_FALSE(r2.completed);

  // The last stage backwarding micro-batch 1 before 0 while stage 0 waits for 0's gradient
  // first is merely slow (sends are non-blocking), not a deadlock.
  const PipelineSimulation r3 =
      simulate_lists({parse("F0 sa0 F1 sa1 rg0 B0 rg1 B1"), parse("ra0 F0 ra1 F1 B1 sg1 B0 sg0")});
  EXPECT_TRUE(r3.completed) << r3.deadlock_report;

  // Each message is received once: a second receive of micro-batch 0 with only one send blocks.
  const PipelineSimulation r4 = simulate_lists({parse("F0 sa0"), parse("ra0 F0 ra0 F0")});
  EXPECT_FALSE(r4.completed);
}

TEST(PipelineSimulation, RejectsMessagesToMissingNeighbours) {
  EXPECT_THROW(simulate_lists({parse("ra0 F0")}), std::invalid_argument);
  EXPECT_THROW(simulate_lists({parse("F0 sa0")}), std::invalid_argument);
  EXPECT_THROW(simulate_lists({parse("F0 sg0"), parse("F0")}), std::invalid_argument);
  EXPECT_THROW(simulate_lists({parse("F0"), parse("rg0 F0")}), std::invalid_argument);
  EXPECT_THROW(simulate_lists({parse("F0")}, -1.0, 2.0), std::invalid_argument);
}

// ---- blocking sends and paired messages -------------------------------------------------

TEST(PairMessages, GroupsEachSendWithTheReceiveRightAfterIt) {
  // 1f1b, stage 0 of 2, 3 micro-batches: the steady state's send_activation(i+1) meets
  // recv_grad(i); the warm-up's send and the cool-down's receives stay alone.
  EXPECT_EQ(notation(pair_messages(pipeline_actions(k1f1b, 2, 0, 3))),
            "F0 sa0 F1 sa1+ rg0 B0 F2 sa2+ rg1 B1 rg2 B2");
  // Stage 1 of 2: send_grad(i) meets recv_activation(i+1).
  EXPECT_EQ(notation(pair_messages(pipeline_actions(k1f1b, 2, 1, 3))),
            "ra0 F0 B0 sg0+ ra1 F1 B1 sg1+ ra2 F2 B2 sg2");
  // A middle stage of 3 in warm-up: the activation out with the next one in.
  EXPECT_EQ(notation(pair_messages(pipeline_actions(k1f1b, 3, 1, 2))),
            "ra0 F0 sa0+ ra1 F1 sa1+ rg0 B0 sg0+ rg1 B1 sg1");
  // Never two sends or two receives in one group, never a compute.
  EXPECT_EQ(notation(pair_messages(parse("F0 sa0 sg0 rg0 ra0 B0"))), "F0 sa0 sg0+ rg0 ra0 B0");
}

TEST(PipelineSimulation, UnpairedOneFOneBDeadlocksWithBlockingSends) {
  // Stage 0 sends micro-batch 1's activation while stage 1 sends micro-batch 0's gradient:
  // with rendezvous sends each waits for a receive the other posts only afterwards.
  const PipelineSimulation r = simulate_pipeline(k1f1b, 2, 2, 1.0, 2.0, SendModel::rendezvous);
  EXPECT_FALSE(r.completed);
  EXPECT_NE(r.deadlock_report.find("stage 0 waits forever at action 3 send_activation(1)"),
            std::string::npos)
      << r.deadlock_report;
  EXPECT_NE(r.deadlock_report.find("stage 1 waits forever at action 3 send_grad(0)"),
            std::string::npos)
      << r.deadlock_report;
  // The same lists complete when sends are buffered (what the MPI executor relies on).
  EXPECT_TRUE(simulate_pipeline(k1f1b, 2, 2, 1.0, 2.0, SendModel::buffered).completed);
}

TEST(PipelineSimulation, PairedMessagesNeverDeadlockWithBlockingSends) {
  // Every stage count 1-8 and micro-batch count 1-16, both schedules: the paired lists
  // complete under rendezvous sends, in the same time as with buffered sends (a group waits
  // only for a partner that is already due), and without pairing 1f1b deadlocks whenever a
  // stage has both a warm-up and a steady state.
  for (PipelineKind kind : kKinds)
    for (int p = 1; p <= 8; ++p)
      for (int m = 1; m <= 16; ++m) {
        SCOPED_TRACE(std::string(to_string(kind)) + " stages " + std::to_string(p) + " m " +
                     std::to_string(m));
        const PipelineSimulation r =
            simulate_pipeline(kind, p, m, 1.0, 2.0, SendModel::rendezvous, true);
        ASSERT_TRUE(r.completed) << r.deadlock_report;
        EXPECT_DOUBLE_EQ(r.makespan, simulate_pipeline(kind, p, m).makespan);
        for (int s = 0; s < p; ++s)
          EXPECT_EQ(r.max_in_flight[s], pipeline_in_flight(kind, p, s, m)) << "stage " << s;
        const bool unpaired_ok =
            simulate_pipeline(kind, p, m, 1.0, 2.0, SendModel::rendezvous, false).completed;
        if (kind == k1f1b && p >= 2 && m >= 2) EXPECT_FALSE(unpaired_ok);
      }
}

TEST(PipelineSimulation, RendezvousSendWaitsForTheReceiver) {
  // Stage 1 posts its receive only after a forward of its own (time 1): stage 0's send, posted
  // at 1, completes at 1 and its next forward ends at 2; stage 1 waits for nothing.
  const PipelineSimulation r = simulate_lists({parse("F0 sa0 F1"), parse("F9 ra0 F0")}, 1.0, 2.0,
                                              SendModel::rendezvous);
  ASSERT_TRUE(r.completed) << r.deadlock_report;
  EXPECT_DOUBLE_EQ(r.makespan, 2.0);
  // Posted later (after 3 units of work), the receive holds the send until then.
  const PipelineSimulation late = simulate_lists({parse("F0 sa0 F1"), parse("F8 F9 F7 ra0 F0")},
                                                 1.0, 2.0, SendModel::rendezvous);
  ASSERT_TRUE(late.completed) << late.deadlock_report;
  EXPECT_DOUBLE_EQ(late.idle_fraction[0], 1.0 - 2.0 / 4.0);  // stage 0: 2 of 4 busy
}

TEST(PipelineSimulation, RejectsGroupsThatJoinACompute) {
  EXPECT_THROW(simulate_lists({parse("F0+ F1")}), std::invalid_argument);
  EXPECT_THROW(simulate_lists({parse("F0 sa0+"), parse("ra0 F0")}), std::invalid_argument);
  EXPECT_THROW(simulate_lists({parse("F0 sa0+ F1"), parse("ra0 F0")}), std::invalid_argument);
}

// ---- tags -------------------------------------------------------------------------------

TEST(PipelineTag, UniquePerMicroBatchAndDirection) {
  std::set<int> seen;
  for (int i = 0; i <= 1000; ++i)
    for (bool backward : {false, true}) {
      const int tag = pipeline_tag(i, backward);
      EXPECT_TRUE(seen.insert(tag).second) << "tag " << tag << " repeats";
      EXPECT_GE(tag, 0);
      EXPECT_LE(tag, 32767);  // the smallest MPI_TAG_UB MPI allows
      EXPECT_FALSE(tag >= 101 && tag <= 105) << "collides with wire::Tag";
    }
  EXPECT_EQ(pipeline_tag(3, false), kPipelineTagBase + 6);  // the documented formula
  EXPECT_EQ(pipeline_tag(3, true), kPipelineTagBase + 7);
  EXPECT_LE(pipeline_tag(kPipelineMaxMicroBatch, true), 32767);
  EXPECT_THROW(pipeline_tag(kPipelineMaxMicroBatch + 1, false), std::invalid_argument);
  EXPECT_THROW(pipeline_tag(-1, false), std::invalid_argument);
}

}  // namespace
}  // namespace pdtrain
