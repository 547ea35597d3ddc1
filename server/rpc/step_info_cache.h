// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_SERVER_RPC_STEP_INFO_CACHE_H_
#define REPVAR_SERVER_RPC_STEP_INFO_CACHE_H_

#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "repvar/v1/step.pb.h"
#include "server/core/coordinator.h"

namespace repvar::server {

// The step description as a message, built once per step and copied into
// each BeginStep/GetStep answer (32 trainers and 32 workers ask per step);
// without its layout when the caller already holds `known_layout`; with
// each distinct participant list once when it asked for `shared_lists`.
// Shared by the trainer- and worker-facing services. Thread-safe.
class StepInfoCache {
 public:
  void Answer(const SharedStep& step, uint64_t known_layout, bool shared_lists, v1::StepInfo* resp)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Mutex mu_;
  std::shared_ptr<const StepInfo> source_[2] ABSL_GUARDED_BY(mu_);  // [shared_lists]
  v1::StepInfo proto_[2] ABSL_GUARDED_BY(mu_);
};

}  // namespace repvar::server

#endif  // REPVAR_SERVER_RPC_STEP_INFO_CACHE_H_
