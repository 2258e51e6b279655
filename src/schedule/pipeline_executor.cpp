#include "pdtrain/schedule/pipeline_executor.hpp"

#include <algorithm>
#include <string>

#include "pdtrain/core/mpi_check.hpp"
#include "pdtrain/core/quiet_wait.hpp"
#include "pdtrain/core/timer.hpp"

namespace pdtrain {

PipelineExecutor::PipelineExecutor(MPI_Comm pp_comm, PipelineKind kind, int micro_batches,
                                   std::int64_t activation_numel, TraceRecorder* trace)
    : comm_(pp_comm), kind_(kind), micro_batches_(micro_batches), numel_(activation_numel),
      trace_(trace) {
  MPI_CHECK(MPI_Comm_rank(comm_, &stage_));
  MPI_CHECK(MPI_Comm_size(comm_, &stages_));
  recv_.resize(static_cast<std::size_t>(numel_));
}

double PipelineExecutor::recv(int from, int tag) {
  TraceSpan span(trace_, "recv " + std::to_string(tag), "p2p");
  const double t0 = now_seconds();
  MPI_Request r;
  MPI_CHECK(MPI_Irecv(recv_.data(), static_cast<int>(numel_), MPI_FLOAT, from, tag, comm_, &r));
  wait_quietly(&r);
  return now_seconds() - t0;
}

void PipelineExecutor::send(int to, int tag, const float* data) {
  TraceSpan span(trace_, "send " + std::to_string(tag), "p2p");
  // The buffer must live until the send completes at the end of the step.
  const std::size_t i = send_reqs_.size();
  if (send_bufs_.size() <= i) send_bufs_.emplace_back(static_cast<std::size_t>(numel_));
  std::copy_n(data, numel_, send_bufs_[i].begin());
  send_reqs_.emplace_back();
  MPI_CHECK(MPI_Isend(send_bufs_[i].data(), static_cast<int>(numel_), MPI_FLOAT, to, tag, comm_,
                      &send_reqs_.back()));
}

void PipelineExecutor::finish_sends() {
  wait_all_quietly(static_cast<int>(send_reqs_.size()), send_reqs_.data());
  send_reqs_.clear();
}

void PipelineExecutor::run(const std::vector<PipelineAction>& actions, PipelineStageOps& ops,
                           double* waited) {
  const bool first = stage_ == 0;
  for (const PipelineAction& a : actions) {
    const int mb = a.micro_batch;
    switch (a.kind) {
      case ActionKind::recv_activation:
        *waited += recv(stage_ - 1, pipeline_tag(mb, false));
        break;
      case ActionKind::forward: {
        TraceSpan span(trace_, "forward mb" + std::to_string(mb), "compute");
        ops.forward(mb, first ? nullptr : recv_.data());
        break;
      }
      case ActionKind::send_activation:
        send(stage_ + 1, pipeline_tag(mb, false), ops.output(mb));
        break;
      case ActionKind::recv_grad:
        *waited += recv(stage_ + 1, pipeline_tag(mb, true));
        break;
      case ActionKind::backward: {
        TraceSpan span(trace_, "backward mb" + std::to_string(mb), "compute");
        ops.backward(mb, stage_ == stages_ - 1 ? nullptr : recv_.data());
        break;
      }
      case ActionKind::send_grad:
        send(stage_ - 1, pipeline_tag(mb, true), ops.dinput());
        break;
    }
  }
  const double t0 = now_seconds();
  finish_sends();
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
