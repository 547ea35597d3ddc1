// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_CLIENT_STEP_STATUS_H_
#define REPVAR_CLIENT_STEP_STATUS_H_

#include <grpcpp/grpcpp.h>

#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "client/client_impl.h"
#include "repvar/step.h"

namespace repvar::client_internal {

// Streams step events after `after_seq` to `fn` until it returns false or
// the call ends (its deadline, or ctx.TryCancel()).
absl::Status StreamStepEvents(ClientAccess::Impl& c, grpc::ClientContext& ctx, int64_t after_seq,
                              const std::function<bool(const StepEventInfo&)>& fn);

// The same in the background, with no thread of its own: `fn` runs on
// gRPC's callback threads, one event at a time, until it returns false or
// Stop(). Stop (and the destructor) ends the stream and waits for it.
class StepEventWatch final : public grpc::ClientReadReactor<v1::StepEvent> {
 public:
  StepEventWatch(ClientAccess::Impl& c, int64_t after_seq,
                 std::function<bool(const StepEventInfo&)> fn);
  ~StepEventWatch() override { Stop(); }
  StepEventWatch(const StepEventWatch&) = delete;
  StepEventWatch& operator=(const StepEventWatch&) = delete;

  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const std::function<bool(const StepEventInfo&)> fn_;
  grpc::ClientContext ctx_;
  v1::WatchStepsRequest req_;
  v1::StepEvent event_;  // the read in flight
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace repvar::client_internal

#endif  // REPVAR_CLIENT_STEP_STATUS_H_
