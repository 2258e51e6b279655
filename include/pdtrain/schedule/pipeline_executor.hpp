#pragma once
// Runs a stage's pipeline action list (pipeline_schedule.hpp) with point-to-point messages
// between neighbouring stages, through the pp group's collectives (core/collectives.hpp).
// The list is paired (pair_messages): a send and the receive right after it are one group,
// posted together right before the compute that needs the receive; the group ends (its receive
// has landed) before that compute. Sends leave from buffers owned by the executor and complete
// at the end of the step. Paired, the 1F1B and GPipe lists cannot deadlock even when a send
// blocks until matched (NCCL; the schedule tests simulate every stage/micro-batch count under
// both send models), and tags (pipeline_tag) encode micro-batch and direction, so on MPI a
// message can only match its own receive (NCCL matches in posting order, the same order).
//
// Messages live in the memory the pp group's transport moves: host memory for MPI (the
// executor's own), device memory for NCCL (the receive buffer from a MessageMemory the stage
// side gives, whose outputs are then device pointers too), so a GPU stage's activations and
// their gradients go from GPU to GPU without a host copy. On device memory sends leave from the
// stage's own output (the transport orders them with the compute queue), so no copy is made.
#include <cstdint>
#include <deque>
#include <vector>

#include "pdtrain/core/collectives.hpp"
#include "pdtrain/io/trace.hpp"
#include "pdtrain/schedule/pipeline_schedule.hpp"

namespace pdtrain {

// What the executor asks of the model side for one stage.
class PipelineStageOps {
 public:
  virtual ~PipelineStageOps() = default;
  // Forward of micro-batch `mb`; `input` is the previous stage's output (null on stage 0).
  virtual void forward(int mb, const float* input) = 0;
  // This stage's output for `mb` (valid until its activation slot is reused).
  virtual const float* output(int mb) = 0;
  // Backward of `mb`; `doutput` is the next stage's input gradient (null on the last stage).
  virtual void backward(int mb, const float* doutput) = 0;
  // d(input) of the last backward.
  virtual const float* dinput() = 0;
};

// Where the messages live when it is not host memory.
class MessageMemory {
 public:
  virtual ~MessageMemory() = default;
  // A buffer of n floats that lives as long as this object.
  virtual float* allocate(std::int64_t n) = 0;
};

class PipelineExecutor {
 public:
  // `stages` is the pp group: its rank is this stage, its size the stage count. `memory`: where
  // messages live (null: host memory); it must be what `stages` moves (device memory for a
  // transport whose device_memory() is true) and outlive the executor.
  PipelineExecutor(Collectives& stages, PipelineKind kind, int micro_batches,
                   std::int64_t activation_numel, TraceRecorder* trace,
                   MessageMemory* memory = nullptr);

  // One optimizer step's forward and backward passes. Returns the seconds this stage waited for
  // its neighbours (its share of the pipeline bubble).
  double run_step(PipelineStageOps& ops);
  // Forward passes only (validation), micro-batches 0..count-1.
  void run_forward(PipelineStageOps& ops, int count);

  int stage() const { return stage_; }
  int stages() const { return stages_; }

 private:
  void recv(int from, int tag);  // into recv_, landed at the group's end
  void send(int to, int tag, const float* data);
  double end_group();  // returns seconds waited
  void post(const PipelineAction& a, PipelineStageOps& ops);
  void run(const std::vector<PipelineAction>& actions, PipelineStageOps& ops, double* waited);

  Collectives& comm_;
  PipelineKind kind_;
  int micro_batches_, stage_ = 0, stages_ = 1;
  std::int64_t numel_;
  TraceRecorder* trace_;
  float* buffer();  // a new message buffer of numel_ floats

  MessageMemory* memory_;
  std::deque<std::vector<float>> host_;  // the buffers, in host memory (memory_ null)
  float* recv_ = nullptr;
  std::vector<float*> send_bufs_;  // host memory: the step's sends leave from these
  std::size_t sends_ = 0;  // sends posted this step (send_bufs_ in use)
};

}  // namespace pdtrain
