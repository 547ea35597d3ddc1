// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_CLIENT_STEP_STATUS_H_
#define REPVAR_CLIENT_STEP_STATUS_H_

#include <grpcpp/grpcpp.h>

#include <functional>

#include "absl/status/status.h"
#include "client/client_impl.h"
#include "repvar/step.h"

namespace repvar::client_internal {

// Streams step events after `after_seq` to `fn` until it returns false or
// the call ends (its deadline, or ctx.TryCancel()).
absl::Status StreamStepEvents(ClientAccess::Impl& c, grpc::ClientContext& ctx, int64_t after_seq,
                              const std::function<bool(const StepEventInfo&)>& fn);

}  // namespace repvar::client_internal

#endif  // REPVAR_CLIENT_STEP_STATUS_H_
