#include "pdtrain/schedule/pipeline_executor.hpp"

#include <algorithm>
#include <string>

#include "pdtrain/core/error.hpp"
#include "pdtrain/core/timer.hpp"

namespace pdtrain {

PipelineExecutor::PipelineExecutor(Collectives& stages, PipelineKind kind, int micro_batches,
                                   std::int64_t activation_numel, TraceRecorder* trace,
                                   MessageMemory* memory)
    : comm_(stages), kind_(kind), micro_batches_(micro_batches), stage_(stages.rank()),
      stages_(stages.size()), numel_(activation_numel), trace_(trace), memory_(memory) {
  PDT_CHECK(stages.device_memory() == (memory != nullptr),
            std::string("pipeline: the pp group's transport (") + stages.transport() +
                ") moves " + (stages.device_memory() ? "device" : "host") +
                " memory, but the messages are in " + (memory ? "device" : "host") + " memory");
  if (stages_ > 1) recv_ = buffer();
}

float* PipelineExecutor::buffer() {
  if (memory_) return memory_->allocate(numel_);
  return host_.emplace_back(static_cast<std::size_t>(numel_)).data();
}

void PipelineExecutor::recv(int from, int tag) {
  TraceSpan span(trace_, "recv " + std::to_string(tag), "p2p");
  comm_.recv(recv_, numel_, from, tag);
}

void PipelineExecutor::send(int to, int tag, const float* data) {
  TraceSpan span(trace_, "send " + std::to_string(tag), "p2p");
  if (memory_) {
    // Device memory: the send is ordered with the compute queue (the seam's contract), so the
    // compute that may overwrite `data` runs after the send: no copy, no buffer.
    comm_.send(data, numel_, to, tag);
    return;
  }
  // Host memory: the buffer must live until the send completes at the end of the step.
  if (send_bufs_.size() <= sends_) send_bufs_.push_back(buffer());
  float* buf = send_bufs_[sends_++];
  std::copy_n(data, numel_, buf);
  comm_.send(buf, numel_, to, tag);
}

double PipelineExecutor::end_group() {
  TraceSpan span(trace_, "wait", "p2p");
  const double t0 = now_seconds();
  comm_.end_group();
  return now_seconds() - t0;
}

void PipelineExecutor::post(const PipelineAction& a, PipelineStageOps& ops) {
  const int mb = a.micro_batch;
  switch (a.kind) {
    case ActionKind::recv_activation: recv(stage_ - 1, pipeline_tag(mb, false)); break;
    case ActionKind::send_activation: send(stage_ + 1, pipeline_tag(mb, false), ops.output(mb)); break;
    case ActionKind::recv_grad: recv(stage_ + 1, pipeline_tag(mb, true)); break;
    case ActionKind::send_grad: send(stage_ - 1, pipeline_tag(mb, true), ops.dinput()); break;
    default: PDT_CHECK(false, "pipeline: a compute action posted as a message");
  }
}

void PipelineExecutor::run(const std::vector<PipelineAction>& actions, PipelineStageOps& ops,
                           double* waited) {
  for (const PipelineAction& a : pair_messages(actions)) {
    const int mb = a.micro_batch;
    if (is_message(a.kind)) {
      post(a, ops);
      if (!a.grouped_with_next) *waited += end_group();
    } else if (a.kind == ActionKind::forward) {
      TraceSpan span(trace_, "forward mb" + std::to_string(mb), "compute");
      ops.forward(mb, stage_ == 0 ? nullptr : recv_);
    } else {
      TraceSpan span(trace_, "backward mb" + std::to_string(mb), "compute");
      ops.backward(mb, stage_ == stages_ - 1 ? nullptr : recv_);
    }
  }
  const double t0 = now_seconds();
  comm_.finish_sends();
  sends_ = 0;
  *waited += now_seconds() - t0;
}

double PipelineExecutor::run_step(PipelineStageOps& ops) {
  double waited = 0.0;
  run(pipeline_actions(kind_, stages_, stage_, micro_batches_), ops, &waited);
  return waited;
}

void PipelineExecutor::run_forward(PipelineStageOps& ops, int count) {
  // Forward-only passes: the GPipe list without its backward half.
  std::vector<PipelineAction> actions;
  for (const PipelineAction& a : pipeline_actions(PipelineKind::gpipe, stages_, stage_, count))
    if (a.kind == ActionKind::recv_activation || a.kind == ActionKind::forward ||
        a.kind == ActionKind::send_activation)
      actions.push_back(a);
  double waited = 0.0;
  run(actions, ops, &waited);
}

}  // namespace pdtrain
