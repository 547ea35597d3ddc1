// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_SERVER_RPC_GRPC_WORKER_CLIENT_H_
#define REPVAR_SERVER_RPC_GRPC_WORKER_CLIENT_H_

#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "repvar/v1/worker.grpc.pb.h"
#include "server/worker_client.h"

namespace repvar::server {

// WorkerClient over gRPC: one channel per worker address, reused; every call
// has a deadline that grows with the bytes it carries. Thread-safe.
class GrpcWorkerClient final : public WorkerClient {
 public:
  struct Options {
    absl::Duration base_deadline = absl::Seconds(30);
    double min_bytes_per_second = 50e6;  // deadline slack for big tensors
    size_t chunk_bytes = 1 << 20;
  };
  GrpcWorkerClient() : GrpcWorkerClient(Options()) {}
  explicit GrpcWorkerClient(Options options) : options_(options) {}

  absl::Status WriteReplicas(const WorkerTarget& target,
                             std::span<const ReplicaWrite> writes) override;
  absl::StatusOr<ReplicaValue> ReadReplica(const WorkerTarget& target, uint64_t variable_id,
                                           int32_t replica) override;
  absl::Status DropVariable(const WorkerTarget& target, uint64_t variable_id) override;

 private:
  v1::WorkerReplicas::Stub* StubFor(const std::string& address) ABSL_LOCKS_EXCLUDED(mu_);

  const Options options_;
  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<v1::WorkerReplicas::Stub>> stubs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace repvar::server

#endif  // REPVAR_SERVER_RPC_GRPC_WORKER_CLIENT_H_
