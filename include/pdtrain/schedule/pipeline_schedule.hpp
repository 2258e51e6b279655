#pragma once
// Pipeline-parallel schedules: the ordered actions one stage performs for one optimizer step of
// m micro-batches. Two flush schedules (every micro-batch's backward finishes before the step
// ends, so both give the same gradients):
//
//  - gpipe ("all-forward-all-backward"): forward of micro-batches 0..m-1, then backward of
//    0..m-1. A stage holds the activations of all m micro-batches at once.
//  - 1f1b (PipeDream-flush, Megatron's default): stage s of p runs w = min(p-s-1, m) warmup
//    forwards, then alternates forward(i+w) / backward(i) while forwards remain, then runs the
//    remaining backwards. A stage holds at most min(p-s, m) micro-batches' activations.
//
// Backwards run in micro-batch order 0..m-1 in both. Every forward on a non-first stage is
// preceded by its recv_activation and every forward on a non-last stage followed by its
// send_activation; every backward on a non-last stage is preceded by its recv_grad and every
// backward on a non-first stage followed by its send_grad. The last stage computes the loss in
// its forward and starts backward itself.
//
// The lists are deadlock-free when sends do not wait for the matching receive (MPI_Isend, or a
// send the runtime buffers): with blocking rendezvous sends (NCCL's ncclSend: the stream waits
// until the peer has posted the receive), 1f1b's send_activation(i+w) on stage s and
// send_grad(i) on stage s+1 can wait on each other. pair_messages() fixes that the way
// Megatron's send_forward_recv_backward does: each send is posted in one group with the receive
// right after it (ncclGroupStart/End), and a group waits until all its messages are matched, so
// stage s's {send_activation(i+w), recv_grad(i)} meets stage s+1's {send_grad(i),
// recv_activation(i+w)}. simulate_pipeline() checks a schedule under either send model.
//
// Pure: no MPI, no model. PipelineExecutor (pipeline_executor.hpp) turns the actions into MPI
// messages and calls on the stage (PipelineStageOps, which the app's StageRunner implements).
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

namespace pdtrain {

enum class PipelineKind { gpipe, one_f_one_b };

// "gpipe" or "1f1b"; nullopt for anything else.
std::optional<PipelineKind> pipeline_kind_from_string(const std::string& s);
const char* to_string(PipelineKind kind);  // "gpipe" | "1f1b"

enum class ActionKind { recv_activation, forward, send_activation, recv_grad, backward, send_grad };
const char* to_string(ActionKind kind);  // the enumerator's name

struct PipelineAction {
  ActionKind kind;
  int micro_batch;
  // Posted in one group with the next action (both messages): the group's messages are
  // started together and the stage goes on when all of them are done.
  bool grouped_with_next = false;
  bool operator==(const PipelineAction&) const = default;
};
std::ostream& operator<<(std::ostream& os, const PipelineAction& a);  // "forward(3)"

bool is_message(ActionKind kind);  // a send or a receive
bool is_send(ActionKind kind);

// The ordered actions of stage `stage` (0-based, of `stages`) for one optimizer step of
// `micro_batches` micro-batches. Stage 0 has no recv_activation/send_grad; the last stage has no
// send_activation/recv_grad. With one stage: forward/backward pairs (1f1b) or all forwards then
// all backwards (gpipe). Throws std::invalid_argument if stages < 1, micro_batches < 1 or
// stage is not in [0, stages).
std::vector<PipelineAction> pipeline_actions(PipelineKind kind, int stages, int stage,
                                             int micro_batches);

// `list` with every send that is followed at once by a receive grouped with it (a send is never
// grouped with another send, nor a receive with a receive: each group holds at most one message
// to each neighbour). What the executor runs, on either transport.
std::vector<PipelineAction> pair_messages(std::vector<PipelineAction> list);

// MPI tag of the message carrying micro-batch `micro_batch`'s activation (backward = false,
// stage s -> s+1) or gradient (backward = true, stage s+1 -> s):
//   tag = kPipelineTagBase + 2 * micro_batch + (backward ? 1 : 0)
// Unique per (micro_batch, direction). The base keeps the tags clear of the holder protocol's
// (wire::Tag, 101..105) should the two ever share a communicator. Throws std::invalid_argument
// if micro_batch < 0 or the tag would exceed 32767, the smallest MPI_TAG_UB MPI allows
// (so micro_batch <= kPipelineMaxMicroBatch).
inline constexpr int kPipelineTagBase = 1000;
inline constexpr int kPipelineMaxMicroBatch = (32767 - kPipelineTagBase - 1) / 2;
int pipeline_tag(int micro_batch, bool backward);

// The most micro-batches whose activations stage `stage` holds at once (forward done, backward
// not yet): gpipe m, 1f1b min(stages - stage, m). Sizes the stage's activation slots. Same
// argument checks as pipeline_actions().
int pipeline_in_flight(PipelineKind kind, int stages, int stage, int micro_batches);

// The ideal bubble (idle) fraction of a flush schedule, (stages-1) / (micro_batches+stages-1),
// reported next to the measured one. Throws std::invalid_argument if stages or micro_batches < 1.
double ideal_bubble_fraction(int stages, int micro_batches);

// The outcome of running every stage's action list together (see simulate_lists).
struct PipelineSimulation {
  bool completed = false;             // every stage reached the end of its list
  double makespan = 0.0;              // time at which the last stage finished (or got stuck)
  std::vector<double> idle_fraction;  // per stage: 1 - compute time / makespan
  std::vector<int> max_in_flight;     // per stage: most micro-batches forwarded, not yet backwarded
  std::string deadlock_report;        // empty if completed; otherwise where each stuck stage waits
};

// How a send completes. buffered: at once (MPI_Isend completed later, or a send the runtime
// buffers), the message queued with the sender's clock. rendezvous: only when the receiver has
// posted the matching receive (ncclSend, a large blocking MPI_Send), at the later of the two
// posting times.
enum class SendModel { buffered, rendezvous };

// Runs `lists[s]` as stage s's actions, all stages at once: forward takes t_forward, backward
// t_backward, sends and receives take no time. Messages are posted one group at a time (an
// action alone, or actions joined by grouped_with_next): the stage posts every message of the
// group, then waits until each is done. A receive is done once the matching message
// (send_activation(i) of stage s-1 for recv_activation(i) of stage s, send_grad(i) of stage s+1
// for recv_grad(i) of stage s) has been posted, at the later posting time; a send as `sends`
// says. Finish times do not depend on the order stages are stepped in, so the result is exact.
// A stage that can never proceed is a deadlock. Idle time counts waiting for messages and after
// the stage's last action. Throws std::invalid_argument for negative times or micro-batches, a
// group that joins a compute, or an action that names a neighbour that does not exist
// (recv_activation/send_grad on stage 0, send_activation/recv_grad on the last stage).
PipelineSimulation simulate_lists(const std::vector<std::vector<PipelineAction>>& lists,
                                  double t_forward = 1.0, double t_backward = 2.0,
                                  SendModel sends = SendModel::buffered);

// simulate_lists on pipeline_actions() of every stage, with pair_messages() applied if `paired`.
PipelineSimulation simulate_pipeline(PipelineKind kind, int stages, int micro_batches,
                                     double t_forward = 1.0, double t_backward = 2.0,
                                     SendModel sends = SendModel::buffered, bool paired = false);

}  // namespace pdtrain
