// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_WORKER_RPC_REPLICAS_SERVICE_H_
#define REPVAR_WORKER_RPC_REPLICAS_SERVICE_H_

#include <cstdint>

#include "common/base/memory_budget.h"
#include "common/base/thread_pool.h"
#include "common/rpc/arena_allocator.h"
#include "common/rpc/chunk_frame.h"
#include "repvar/v1/worker.grpc.pb.h"
#include "worker/core/data_plane.h"
#include "worker/core/replica_store.h"

namespace repvar::worker {

// WriteSmallReplicas runs on the callback API: whole small tensors apply at
// once, without waiting on anything, so the call is answered on the thread
// that received it instead of being handed to a pooled thread (one context
// switch less on the small-write path). Its messages live on an arena per
// call (a batch of a thousand headers is parsed without a malloc each).
using ReplicasServiceBase =
    v1::WorkerReplicas::WithCallbackMethod_WriteSmallReplicas<v1::WorkerReplicas::Service>;

// The gRPC face of a worker for the coordinator (repvar.v1.WorkerReplicas):
// proto -> model -> core -> proto, nothing else. Thread-safe.
class ReplicasService final : public ReplicasServiceBase {
 public:
  // `data_plane` may be null: writes asking for a collective are then refused.
  // Tensors being received are charged to `budget` (null: unbounded).
  ReplicasService(uint64_t incarnation, ReplicaStore* store, Collectives* data_plane,
                  MemoryBudget* budget = nullptr)
      : incarnation_(incarnation), store_(store), data_plane_(data_plane), budget_(budget) {
    SetMessageAllocatorFor_WriteSmallReplicas(&small_writes_);
    // WriteReplicas takes chunks from gRPC's slices straight into the value
    // (Drain), and ReadReplica answers in chunk frames: a value's bytes are
    // copied once coming in, and not at all going out.
    MarkMethodStreamed(MethodIndex(v1::WorkerReplicas::service_full_name(), "WriteReplicas"),
                       FrameReadingHandler(this, &ReplicasService::WriteReplicasFrames));
    MarkMethodStreamed(MethodIndex(v1::WorkerReplicas::service_full_name(), "ReadReplica"),
                       FrameStreamingHandler(this, &ReplicasService::ReadReplicaFrames));
  }

  grpc::ServerUnaryReactor* WriteSmallReplicas(grpc::CallbackServerContext*,
                                               const v1::WriteSmallReplicasRequest*,
                                               v1::WriteReplicasResponse*) override;
  // WriteReplicas and ReadReplica (see the constructor).
  grpc::Status WriteReplicasFrames(grpc::ServerContext*, FrameReader*, v1::WriteReplicasResponse*);
  grpc::Status ReadReplicaFrames(grpc::ServerContext*, const v1::ReadReplicaRequest&,
                                 FrameWriter<v1::ReadReplicaRequest>*);
  grpc::Status DropVariable(grpc::ServerContext*, const v1::DropVariableRequest*,
                            v1::DropVariableResponse*) override;
  grpc::Status GetReplicaStatus(grpc::ServerContext*, const v1::GetReplicaStatusRequest*,
                                v1::GetReplicaStatusResponse*) override;

 private:
  const uint64_t incarnation_;
  ReplicaStore* const store_;
  Collectives* const data_plane_;
  MemoryBudget* const budget_;
  // The broadcasts this worker roots (ReplicaWriteSession); the data plane
  // runs one collective at a time, so a few threads are plenty.
  ThreadPool root_broadcasts_{1, 4};
  ArenaMessageAllocator<v1::WriteSmallReplicasRequest, v1::WriteReplicasResponse> small_writes_;
};

}  // namespace repvar::worker

#endif  // REPVAR_WORKER_RPC_REPLICAS_SERVICE_H_
