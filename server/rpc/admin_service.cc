// SPDX-License-Identifier: Apache-2.0
#include "server/rpc/admin_service.h"

#include "common/base/status_util.h"
#include "common/model/names.h"
#include "common/rpc/chunks.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/to_proto.h"

namespace repvar::server {

grpc::Status AdminService::DeleteVariable(grpc::ServerContext*,
                                          const v1::DeleteVariableRequest* req,
                                          v1::DeleteVariableResponse*) {
  if (absl::Status s = ValidateRequestId(req->request_id()); !s.ok()) return ToGrpcStatus(s);
  return ToGrpcStatus(
      core_->DeleteVariable(RequestKey{req->request_id(), Digest(*req)}, req->name()));
}

grpc::Status AdminService::GetClusterStatus(grpc::ServerContext*,
                                            const v1::GetClusterStatusRequest*,
                                            v1::ClusterStatus* resp) {
  TopologyToProto(core_->registry().Snapshot(), resp->mutable_topology());
  for (const VariableView& v : core_->ListVariables("")) {
    VariableViewToProto(v, resp->add_variables());
  }
  StepsStatusToProto(core_->GetSteps(), resp->mutable_steps());
  return grpc::Status::OK;
}

}  // namespace repvar::server
