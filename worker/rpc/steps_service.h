// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_WORKER_RPC_STEPS_SERVICE_H_
#define REPVAR_WORKER_RPC_STEPS_SERVICE_H_

#include <memory>

#include "common/base/memory_budget.h"
#include "common/rpc/chunk_frame.h"
#include "repvar/v1/worker.grpc.pb.h"
#include "worker/core/step_table.h"

namespace repvar::worker {

// CommitStep runs on the callback API: the call that completes a step on
// this host sends the report and returns, and the answer goes back to the
// trainer from the thread that receives the coordinator's answer
// (StepTable::CommitAsync), with no thread of a pool parked for the
// barrier and woken after it.
using StepsServiceBase = v1::WorkerSteps::WithCallbackMethod_CommitStep<v1::WorkerSteps::Service>;

// The gRPC face of a worker for the trainers on its host
// (repvar.v1.WorkerSteps): proto -> model -> core -> proto. Thread-safe.
class StepsService final : public StepsServiceBase {
 public:
  // Tensors being received are charged to `budget` (null: unbounded),
  // each trainer connection's to its share of it: `per_connection_bytes`
  // (0: half the budget), so one trainer cannot take all the worker lends.
  explicit StepsService(StepTable* steps, MemoryBudget* budget = nullptr,
                        uint64_t per_connection_bytes = 0)
      : steps_(steps),
        budget_(budget),
        connections_(budget, per_connection_bytes > 0 || budget == nullptr
                                 ? per_connection_bytes
                                 : budget->capacity() / 2) {
    // StepWrite takes chunks from gRPC's slices straight into the value
    // (Drain), and StepRead answers in chunk frames.
    MarkMethodStreamed(MethodIndex(v1::WorkerSteps::service_full_name(), "StepWrite"),
                       FrameReadingHandler(this, &StepsService::StepWriteFrames));
    MarkMethodStreamed(MethodIndex(v1::WorkerSteps::service_full_name(), "StepRead"),
                       FrameStreamingHandler(this, &StepsService::StepReadFrames));
  }

  // StepWrite and StepRead (see the constructor).
  grpc::Status StepWriteFrames(grpc::ServerContext*, FrameReader*, v1::StepWriteResponse*);
  grpc::Status StepReadFrames(grpc::ServerContext*, const v1::StepReadRequest&,
                              FrameWriter<v1::StepReadRequest>*);
  grpc::Status StepReadSmall(grpc::ServerContext*, const v1::StepReadSmallRequest*,
                             v1::StepReadSmallResponse*) override;
  grpc::Status StepWriteSmall(grpc::ServerContext*, const v1::StepWriteSmallRequest*,
                              v1::StepWriteResponse*) override;

  // StepReadSmall's bounds: reads a call, a value's bytes, and an answer
  // (under gRPC's default 4 MiB receive limit; each value's message and
  // its field's tag and length, at most `kFieldFramingBytes`).
  static constexpr uint64_t kMaxSmallReads = 16384;
  static constexpr uint64_t kMaxSmallReadBytes = 1 << 20;
  static constexpr uint64_t kMaxSmallReadAnswerBytes = 3 << 20;
  static constexpr uint64_t kFieldFramingBytes = 6;
  grpc::ServerUnaryReactor* CommitStep(grpc::CallbackServerContext*, const v1::CommitStepRequest*,
                                       v1::StepResolution*) override;
  grpc::Status DiscardStep(grpc::ServerContext*, const v1::DiscardStepRequest*,
                           v1::DiscardStepResponse*) override;
  grpc::Status StepMap(grpc::ServerContext*, const v1::StepMapRequest*,
                       v1::StepMapResponse*) override;
  grpc::Status MapLocalReads(grpc::ServerContext*, const v1::MapLocalReadsRequest*,
                             v1::MapLocalReadsResponse*) override;
  // Where the local read table is (a memfd of this process); unset: none.
  void set_local_reads(int fd, uint64_t bytes) {
    local_reads_fd_ = fd;
    local_reads_bytes_ = bytes;
  }
  grpc::Status StepUnmap(grpc::ServerContext*, const v1::StepUnmapRequest*,
                         v1::StepUnmapResponse*) override;

 private:
  // The share of the budget for the connection `ctx` came on (null when
  // the worker has no budget).
  std::shared_ptr<MemoryBudget> Share(const grpc::ServerContext* ctx);

  StepTable* const steps_;
  MemoryBudget* const budget_;
  ConnectionBudgets connections_;
  int local_reads_fd_ = -1;
  uint64_t local_reads_bytes_ = 0;
};

}  // namespace repvar::worker

#endif  // REPVAR_WORKER_RPC_STEPS_SERVICE_H_
