// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_SERVER_RPC_ADMIN_SERVICE_H_
#define REPVAR_SERVER_RPC_ADMIN_SERVICE_H_

#include <functional>

#include "repvar/v1/coordinator.grpc.pb.h"
#include "server/core/coordinator.h"
#include "server/core/scalar_board.h"

namespace repvar::server {

// The gRPC face of the coordinator for operators (repvar.v1.CoordinatorAdmin).
// Thread-safe.
class AdminService final : public v1::CoordinatorAdmin::Service {
 public:
  // `on_drain(draining)` runs after each Drain call (the daemon sets its
  // health from it). `scalars` (may be null) goes into the cluster status.
  AdminService(Coordinator* core, const ScalarBoard* scalars, std::function<void(bool)> on_drain)
      : core_(core), scalars_(scalars), on_drain_(std::move(on_drain)) {}

  grpc::Status DeleteVariable(grpc::ServerContext*, const v1::DeleteVariableRequest*,
                              v1::DeleteVariableResponse*) override;
  grpc::Status GetClusterStatus(grpc::ServerContext*, const v1::GetClusterStatusRequest*,
                                v1::ClusterStatus*) override;
  grpc::Status SaveCheckpoint(grpc::ServerContext* ctx, const v1::SaveCheckpointRequest* req,
                              grpc::ServerWriter<v1::SaveCheckpointResponse>* writer) override;
  grpc::Status Drain(grpc::ServerContext*, const v1::DrainRequest* req,
                     v1::DrainResponse* resp) override;

 private:
  Coordinator* const core_;
  const ScalarBoard* const scalars_;
  const std::function<void(bool)> on_drain_;
};

}  // namespace repvar::server

#endif  // REPVAR_SERVER_RPC_ADMIN_SERVICE_H_
