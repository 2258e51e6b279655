#include "pdtrain/schedule/pipeline_schedule.hpp"

#include <algorithm>
#include <map>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <tuple>

namespace pdtrain {

namespace {

void check_shape(int stages, int stage, int micro_batches) {
  if (stages < 1) throw std::invalid_argument("pipeline: stages must be >= 1");
  if (micro_batches < 1) throw std::invalid_argument("pipeline: micro_batches must be >= 1");
  if (stage < 0 || stage >= stages)
    throw std::invalid_argument("pipeline: stage " + std::to_string(stage) + " not in [0, " +
                                std::to_string(stages) + ")");
}

// Appends micro-batch i's forward with the messages around it, then the same for a backward.
struct ListBuilder {
  std::vector<PipelineAction>& out;
  bool first, last;
  void forward(int i) {
    if (!first) out.push_back({ActionKind::recv_activation, i});
    out.push_back({ActionKind::forward, i});
    if (!last) out.push_back({ActionKind::send_activation, i});
  }
  void backward(int i) {
    if (!last) out.push_back({ActionKind::recv_grad, i});
    out.push_back({ActionKind::backward, i});
    if (!first) out.push_back({ActionKind::send_grad, i});
  }
};

}  // namespace

std::optional<PipelineKind> pipeline_kind_from_string(const std::string& s) {
  if (s == "gpipe") return PipelineKind::gpipe;
  if (s == "1f1b") return PipelineKind::one_f_one_b;
  return std::nullopt;
}

const char* to_string(PipelineKind kind) { return kind == PipelineKind::gpipe ? "gpipe" : "1f1b"; }

const char* to_string(ActionKind kind) {
  switch (kind) {
    case ActionKind::recv_activation: return "recv_activation";
    case ActionKind::forward: return "forward";
    case ActionKind::send_activation: return "send_activation";
    case ActionKind::recv_grad: return "recv_grad";
    case ActionKind::backward: return "backward";
    case ActionKind::send_grad: return "send_grad";
  }
  return "?";
}

std::ostream& operator<<(std::ostream& os, const PipelineAction& a) {
  return os << to_string(a.kind) << '(' << a.micro_batch << ')' << (a.grouped_with_next ? "+" : "");
}

std::vector<PipelineAction> pipeline_actions(PipelineKind kind, int stages, int stage,
                                             int micro_batches) {
  check_shape(stages, stage, micro_batches);
  const int m = micro_batches;
  std::vector<PipelineAction> out;
  out.reserve(static_cast<std::size_t>(m) * 6);
  ListBuilder b{out, stage == 0, stage == stages - 1};
  if (kind == PipelineKind::gpipe) {
    for (int i = 0; i < m; ++i) b.forward(i);
    for (int i = 0; i < m; ++i) b.backward(i);
    return out;
  }
  // 1f1b: enough warmup forwards that the last stage's first backward can start as soon as
  // its first forward is done; then one forward per backward keeps min(p-s, m) in flight.
  const int warmup = std::min(stages - stage - 1, m);
  for (int i = 0; i < warmup; ++i) b.forward(i);
  for (int i = 0; i + warmup < m; ++i) {
    b.forward(i + warmup);
    b.backward(i);
  }
  for (int i = m - warmup; i < m; ++i) b.backward(i);
  return out;
}

bool is_message(ActionKind kind) {
  return kind != ActionKind::forward && kind != ActionKind::backward;
}

bool is_send(ActionKind kind) {
  return kind == ActionKind::send_activation || kind == ActionKind::send_grad;
}

std::vector<PipelineAction> pair_messages(std::vector<PipelineAction> list) {
  for (std::size_t k = 0; k + 1 < list.size(); ++k) {
    const ActionKind next = list[k + 1].kind;
    list[k].grouped_with_next = is_send(list[k].kind) && is_message(next) && !is_send(next);
  }
  if (!list.empty()) list.back().grouped_with_next = false;
  return list;
}

int pipeline_tag(int micro_batch, bool backward) {
  if (micro_batch < 0 || micro_batch > kPipelineMaxMicroBatch)
    throw std::invalid_argument("pipeline_tag: micro_batch " + std::to_string(micro_batch) +
                                " not in [0, " + std::to_string(kPipelineMaxMicroBatch) + "]");
  return kPipelineTagBase + 2 * micro_batch + (backward ? 1 : 0);
}

int pipeline_in_flight(PipelineKind kind, int stages, int stage, int micro_batches) {
  check_shape(stages, stage, micro_batches);
  if (kind == PipelineKind::gpipe) return micro_batches;
  return std::min(stages - stage, micro_batches);
}

double ideal_bubble_fraction(int stages, int micro_batches) {
  check_shape(stages, 0, micro_batches);
  return static_cast<double>(stages - 1) / (micro_batches + stages - 1);
}

namespace {

// A message, by (receiving stage, is gradient, micro-batch). Each key has one sender and one
// receiver, so the n-th send of a key matches the n-th receive of it.
using MessageKey = std::tuple<int, bool, int>;

// One posted message of a stage's open group: which key, which side, its place in that key's
// order of posts.
struct PostedMessage {
  MessageKey key;
  bool send;
  std::size_t index;
};

// The run of all stages' lists; see simulate_lists in the header.
class PipelineSimulator {
 public:
  PipelineSimulator(const std::vector<std::vector<PipelineAction>>& lists, double t_forward,
                    double t_backward, SendModel sends)
      : lists_(lists), p_(static_cast<int>(lists.size())), tf_(t_forward), tb_(t_backward),
        sends_(sends), pc_(p_, 0), clock_(p_, 0.0), busy_(p_, 0.0), held_(p_, 0),
        forwarded_(p_), open_(p_) {
    sim_.max_in_flight.assign(p_, 0);
  }

  PipelineSimulation run() {
    // Step each stage as far as it can go, round after round, until no stage moves. A stage
    // only ever stops at a group of messages, so once a round moves nothing, nothing ever will.
    for (bool moved = true; moved;) {
      moved = false;
      for (int s = 0; s < p_; ++s)
        while (pc_[s] < lists_[s].size() && step(s)) moved = true;
    }
    return result();
  }

 private:
  [[noreturn]] void bad(int s, std::size_t k, const char* why) const {
    std::ostringstream os;
    os << "simulate_lists: stage " << s << " action " << k << " " << lists_[s][k] << ": " << why;
    throw std::invalid_argument(os.str());
  }

  // Runs stage s's next action or group; false if it waits (after posting its messages).
  bool step(int s) {
    const PipelineAction& a = lists_[s][pc_[s]];
    if (a.micro_batch < 0) bad(s, pc_[s], "negative micro-batch");
    if (!is_message(a.kind)) {
      if (a.grouped_with_next) bad(s, pc_[s], "a compute cannot be grouped");
      compute(s, a);
      ++pc_[s];
      return true;
    }
    const bool posted_now = open_[s].empty();
    if (posted_now) post_group(s);
    if (!group_done(s)) return posted_now;  // posting may unblock a neighbour
    pc_[s] += open_[s].size();
    open_[s].clear();
    return true;
  }

  void compute(int s, const PipelineAction& a) {
    const bool forward = a.kind == ActionKind::forward;
    clock_[s] += forward ? tf_ : tb_;
    busy_[s] += forward ? tf_ : tb_;
    if (forward) {
      ++forwarded_[s][a.micro_batch];
      sim_.max_in_flight[s] = std::max(sim_.max_in_flight[s], ++held_[s]);
    } else if (forwarded_[s][a.micro_batch] > 0) {  // frees that micro-batch's activations
      --forwarded_[s][a.micro_batch];
      --held_[s];
    }
  }

  // Posts every message of the group starting at stage s's next action.
  void post_group(int s) {
    for (std::size_t k = pc_[s];; ++k) {
      if (k >= lists_[s].size()) bad(s, k - 1, "the group runs past the end of the list");
      const PipelineAction& a = lists_[s][k];
      if (!is_message(a.kind)) bad(s, k, "a compute cannot be grouped");
      if (a.micro_batch < 0) bad(s, k, "negative micro-batch");
      const bool grad = a.kind == ActionKind::send_grad || a.kind == ActionKind::recv_grad;
      const bool send = is_send(a.kind);
      // A gradient goes down a stage, an activation up.
      const int to = send ? (grad ? s - 1 : s + 1) : s;
      const int from = send ? s : (grad ? s + 1 : s - 1);
      if (to < 0 || to >= p_ || from < 0 || from >= p_)
        bad(s, k, send ? "no neighbour to send to" : "no neighbour sends this");
      const MessageKey key{to, grad, a.micro_batch};
      std::vector<double>& times = send ? sent_[key] : received_[key];
      open_[s].push_back({key, send, times.size()});
      times.push_back(clock_[s]);
      if (!a.grouped_with_next) return;
    }
  }

  // Whether every message of stage s's open group is done; if so the stage's clock moves to
  // the latest time a partner posted its side.
  bool group_done(int s) {
    double done_at = clock_[s];
    for (const PostedMessage& m : open_[s]) {
      if (m.send && sends_ == SendModel::buffered) continue;
      const std::vector<double>& partner = m.send ? received_[m.key] : sent_[m.key];
      if (partner.size() <= m.index) return false;
      done_at = std::max(done_at, partner[m.index]);
    }
    clock_[s] = done_at;
    return true;
  }

  PipelineSimulation result() {
    sim_.completed = true;
    std::ostringstream report;
    for (int s = 0; s < p_; ++s) {
      sim_.makespan = std::max(sim_.makespan, clock_[s]);
      if (pc_[s] < lists_[s].size()) {
        if (sim_.completed) report << "deadlock:";
        sim_.completed = false;
        report << " stage " << s << " waits forever at action " << pc_[s] << " "
               << lists_[s][pc_[s]] << ";";
      }
    }
    sim_.deadlock_report = report.str();
    sim_.idle_fraction.assign(p_, 0.0);
    if (sim_.makespan > 0)
      for (int s = 0; s < p_; ++s) sim_.idle_fraction[s] = 1.0 - busy_[s] / sim_.makespan;
    return sim_;
  }

  const std::vector<std::vector<PipelineAction>>& lists_;
  int p_;
  double tf_, tb_;
  SendModel sends_;
  std::vector<std::size_t> pc_;  // next action of each stage
  std::vector<double> clock_, busy_;
  std::vector<int> held_;
  std::vector<std::map<int, int>> forwarded_;  // micro-batch -> forwards not yet backwarded
  std::vector<std::vector<PostedMessage>> open_;  // each stage's posted, unfinished group
  std::map<MessageKey, std::vector<double>> sent_, received_;  // posting times, in order
  PipelineSimulation sim_;
};

}  // namespace

PipelineSimulation simulate_lists(const std::vector<std::vector<PipelineAction>>& lists,
                                  double t_forward, double t_backward, SendModel sends) {
  if (t_forward < 0 || t_backward < 0)
    throw std::invalid_argument("simulate_lists: negative compute time");
  return PipelineSimulator(lists, t_forward, t_backward, sends).run();
}

PipelineSimulation simulate_pipeline(PipelineKind kind, int stages, int micro_batches,
                                     double t_forward, double t_backward, SendModel sends,
                                     bool paired) {
  check_shape(stages, 0, micro_batches);
  std::vector<std::vector<PipelineAction>> lists;
  for (int s = 0; s < stages; ++s) {
    std::vector<PipelineAction> list = pipeline_actions(kind, stages, s, micro_batches);
    lists.push_back(paired ? pair_messages(std::move(list)) : std::move(list));
  }
  return simulate_lists(lists, t_forward, t_backward, sends);
}

}  // namespace pdtrain
