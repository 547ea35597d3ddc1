// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_SERVER_RPC_GRPC_WORKER_CLIENT_H_
#define REPVAR_SERVER_RPC_GRPC_WORKER_CLIENT_H_

#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/rpc/security.h"
#include "repvar/v1/worker.grpc.pb.h"
#include "server/core/worker_client.h"

namespace repvar::server {

// WorkerClient over gRPC's callback API: one channel per worker address,
// reused; no thread waits for a call (gRPC's callback threads run the
// reactors and the `done` callbacks); every call has a deadline that grows
// with the bytes it carries. Thread-safe.
class GrpcWorkerClient final : public WorkerClient {
 public:
  // The calls in flight to each worker process, so that CancelCalls can end
  // them. Shared with the calls themselves (a late one may finish after the
  // client is gone). Thread-safe.
  class InFlight {
   public:
    static std::string KeyOf(const WorkerTarget& t) {
      return t.address + "#" + std::to_string(t.incarnation);
    }
    // `group`: the data-plane group the call's collective runs in, if any.
    void Add(const std::string& key, const std::shared_ptr<grpc::ClientContext>& ctx,
             const std::string& group = "") ABSL_LOCKS_EXCLUDED(mu_);
    void Remove(const std::string& key, const grpc::ClientContext* ctx) ABSL_LOCKS_EXCLUDED(mu_);
    // Cancels the calls to `key`, and every call in a collective one of them
    // takes part in (the others wait on it inside gloo). With no lock held
    // (a call's completion may run inside TryCancel), keeping each context
    // alive while it does.
    void CancelAll(const std::string& key) ABSL_LOCKS_EXCLUDED(mu_);

   private:
    struct Call {
      std::weak_ptr<grpc::ClientContext> ctx;
      std::string group;
    };
    absl::Mutex mu_;
    std::multimap<std::string, Call> calls_ ABSL_GUARDED_BY(mu_);
  };

  struct Options {
    absl::Duration base_deadline = absl::Seconds(30);
    double min_bytes_per_second = 50e6;  // deadline slack for big tensors
    size_t chunk_bytes = 1 << 20;
    ChannelSecurity security;  // the coordinator's certificate and worker token
  };
  GrpcWorkerClient() : GrpcWorkerClient(Options()) {}
  explicit GrpcWorkerClient(Options options) : options_(std::move(options)) {}

  void WriteReplicasAsync(const WorkerTarget& target, const std::vector<ReplicaWrite>& writes,
                          Done done) override;
  void ReadReplicaAsync(const WorkerTarget& target, uint64_t variable_id, int32_t replica,
                        int64_t min_version, ReadDone done) override;
  void DropVariableAsync(const WorkerTarget& target, uint64_t variable_id, Done done) override;
  void ListReplicasAsync(const WorkerTarget& target, uint64_t fence_floor, absl::Time deadline,
                         ListDone done) override;
  void CancelCalls(const WorkerTarget& target) override;

  // One worker address's channel, its stub, and WriteReplicas and
  // ReadReplica as methods of byte buffers (their chunks go out as
  // ChunkFrames and are read in place).
  struct Channel {
    explicit Channel(std::shared_ptr<grpc::Channel> c);
    const std::shared_ptr<grpc::Channel> channel;
    const std::unique_ptr<v1::WorkerReplicas::Stub> stub;
    const grpc::internal::RpcMethod write_replicas;
    const grpc::internal::RpcMethod read_replica;
  };

 private:
  const Channel& ChannelTo(const std::string& address) ABSL_LOCKS_EXCLUDED(mu_);
  v1::WorkerReplicas::Stub* StubFor(const std::string& address) ABSL_LOCKS_EXCLUDED(mu_);

  const Options options_;
  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<Channel>> channels_ ABSL_GUARDED_BY(mu_);
  const std::shared_ptr<InFlight> in_flight_ = std::make_shared<InFlight>();
};

}  // namespace repvar::server

#endif  // REPVAR_SERVER_RPC_GRPC_WORKER_CLIENT_H_
