// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_SERVER_RPC_ADMIN_SERVICE_H_
#define REPVAR_SERVER_RPC_ADMIN_SERVICE_H_

#include "repvar/v1/coordinator.grpc.pb.h"
#include "server/core/coordinator.h"

namespace repvar::server {

// The gRPC face of the coordinator for operators (repvar.v1.CoordinatorAdmin).
// Thread-safe.
class AdminService final : public v1::CoordinatorAdmin::Service {
 public:
  explicit AdminService(Coordinator* core) : core_(core) {}

  grpc::Status DeleteVariable(grpc::ServerContext*, const v1::DeleteVariableRequest*,
                              v1::DeleteVariableResponse*) override;
  grpc::Status GetClusterStatus(grpc::ServerContext*, const v1::GetClusterStatusRequest*,
                                v1::ClusterStatus*) override;
  grpc::Status SaveCheckpoint(grpc::ServerContext* ctx, const v1::SaveCheckpointRequest* req,
                              grpc::ServerWriter<v1::SaveCheckpointResponse>* writer) override;

 private:
  Coordinator* const core_;
};

}  // namespace repvar::server

#endif  // REPVAR_SERVER_RPC_ADMIN_SERVICE_H_
