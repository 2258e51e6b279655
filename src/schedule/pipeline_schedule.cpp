#include "pdtrain/schedule/pipeline_schedule.hpp"

#include <algorithm>
#include <deque>
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
  return os << to_string(a.kind) << '(' << a.micro_batch << ')';
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

PipelineSimulation simulate_lists(const std::vector<std::vector<PipelineAction>>& lists,
                                  double t_forward, double t_backward) {
  if (t_forward < 0 || t_backward < 0)
    throw std::invalid_argument("simulate_lists: negative compute time");
  const int p = static_cast<int>(lists.size());
  // Messages in flight, by (receiving stage, is gradient, micro-batch): the send times, oldest
  // first. Each key has a single sender, so the queue is in that sender's program order.
  std::map<std::tuple<int, bool, int>, std::deque<double>> queued;
  std::vector<std::size_t> pc(p, 0);  // next action of each stage
  std::vector<double> clock(p, 0.0), busy(p, 0.0);
  std::vector<int> held(p, 0);
  std::vector<std::map<int, int>> forwarded(p);  // micro-batch -> forwards not yet backwarded

  PipelineSimulation sim;
  sim.max_in_flight.assign(p, 0);
  auto bad = [](int s, std::size_t k, const PipelineAction& a, const char* why) {
    std::ostringstream os;
    os << "simulate_lists: stage " << s << " action " << k << " " << a << ": " << why;
    throw std::invalid_argument(os.str());
  };

  // Runs stage s's next action; false if it is a receive whose message has not been sent yet.
  auto step = [&](int s) {
    const std::size_t k = pc[s];
    const PipelineAction& a = lists[s][k];
    if (a.micro_batch < 0) bad(s, k, a, "negative micro-batch");
    switch (a.kind) {
      case ActionKind::recv_activation:
      case ActionKind::recv_grad: {
        const bool grad = a.kind == ActionKind::recv_grad;
        if (grad ? s == p - 1 : s == 0) bad(s, k, a, "no neighbour sends this");
        auto it = queued.find({s, grad, a.micro_batch});
        if (it == queued.end() || it->second.empty()) return false;
        clock[s] = std::max(clock[s], it->second.front());  // waits for the message to arrive
        it->second.pop_front();
        return true;
      }
      case ActionKind::send_activation:
      case ActionKind::send_grad: {
        const bool grad = a.kind == ActionKind::send_grad;
        if (grad ? s == 0 : s == p - 1) bad(s, k, a, "no neighbour to send to");
        queued[{grad ? s - 1 : s + 1, grad, a.micro_batch}].push_back(clock[s]);
        return true;
      }
      case ActionKind::forward:
        clock[s] += t_forward;
        busy[s] += t_forward;
        ++forwarded[s][a.micro_batch];
        sim.max_in_flight[s] = std::max(sim.max_in_flight[s], ++held[s]);
        return true;
      case ActionKind::backward:
        clock[s] += t_backward;
        busy[s] += t_backward;
        if (forwarded[s][a.micro_batch] > 0) {  // frees that micro-batch's activations
          --forwarded[s][a.micro_batch];
          --held[s];
        }
        return true;
    }
    return true;
  };

  // Step each stage as far as it can go, round after round, until no stage moves. A stage only
  // ever stops at a receive, so once a round moves nothing, nothing ever will.
  for (bool moved = true; moved;) {
    moved = false;
    for (int s = 0; s < p; ++s)
      for (; pc[s] < lists[s].size() && step(s); ++pc[s]) moved = true;
  }

  sim.completed = true;
  std::ostringstream report;
  for (int s = 0; s < p; ++s) {
    sim.makespan = std::max(sim.makespan, clock[s]);
    if (pc[s] < lists[s].size()) {
      if (sim.completed) report << "deadlock:";
      sim.completed = false;
      report << " stage " << s << " waits forever at action " << pc[s] << " " << lists[s][pc[s]]
             << ";";
    }
  }
  sim.deadlock_report = report.str();
  sim.idle_fraction.assign(p, 0.0);
  if (sim.makespan > 0)
    for (int s = 0; s < p; ++s) sim.idle_fraction[s] = 1.0 - busy[s] / sim.makespan;
  return sim;
}

PipelineSimulation simulate_pipeline(PipelineKind kind, int stages, int micro_batches,
                                     double t_forward, double t_backward) {
  check_shape(stages, 0, micro_batches);
  std::vector<std::vector<PipelineAction>> lists;
  for (int s = 0; s < stages; ++s)
    lists.push_back(pipeline_actions(kind, stages, s, micro_batches));
  return simulate_lists(lists, t_forward, t_backward);
}

}  // namespace pdtrain
