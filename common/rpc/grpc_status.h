// SPDX-License-Identifier: Apache-2.0
// Status conversion at the gRPC edge. Header-only so that repvar_common never
// links gRPC; include it only from *_service.cc, grpc_*_client.cc and client.cc.
#ifndef REPVAR_COMMON_GRPC_STATUS_H_
#define REPVAR_COMMON_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include <string>

#include "absl/status/status.h"

namespace repvar {

// The codes are numerically identical in both libraries.
inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

inline absl::Status FromGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

}  // namespace repvar

#endif  // REPVAR_COMMON_GRPC_STATUS_H_
