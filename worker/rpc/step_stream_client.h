// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_WORKER_RPC_STEP_STREAM_CLIENT_H_
#define REPVAR_WORKER_RPC_STEP_STREAM_CLIENT_H_

#include <cstdint>
#include <memory>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "repvar/v1/coordinator.grpc.pb.h"

namespace repvar::worker {

// The worker's end of CoordinatorWorkers.StepStream: its step calls
// (GetStep, ReportStep, FinishStep) as tagged messages on one long-lived
// stream instead of a unary call each, every call waited for with its own
// deadline. Calls from many threads share the stream; it runs on gRPC's
// callback API (no thread of its own): writes go out one at a time in the
// order the calls were made, and each answer is handed to the call with
// its tag as it arrives.
//
//   none --(a call)--> open --(the coordinator ends it, or a call is not
//                              answered in time: cancelled)--> broken
//   broken --(the next call)--> a new stream opens; the broken one's calls
//                               still waiting fail UNAVAILABLE
//
// A stream opened while the coordinator cannot be reached (restarting)
// waits for it to come back, up to the deadline of the calls on it (gRPC's
// wait_for_ready); one that ends after it opened fails its calls at once.
// A call not answered in time cancels the stream: its answer may never
// come, a later call should not queue behind it, and a write the
// coordinator stopped reading ends with the cancellation. Deadlines are
// kept by one thread of the client's own, which sleeps until the earliest (a second at most).
//
// CallAsync leaves no thread waiting: its callback runs on the gRPC thread
// that reads the answer (or the deadline thread, or the caller's when the
// client is closing). Call is CallAsync waited for.
// Thread-safe.
class StepStreamClient {
 public:
  using Answer = absl::StatusOr<v1::StepStreamResponse>;
  using Callback = absl::AnyInvocable<void(Answer) &&>;

  explicit StepStreamClient(v1::CoordinatorWorkers::Stub* stub);
  // Cancels the streams and waits until gRPC is done with each; calls
  // still waiting fail UNAVAILABLE.
  ~StepStreamClient();
  StepStreamClient(const StepStreamClient&) = delete;
  StepStreamClient& operator=(const StepStreamClient&) = delete;

  // Sends `req` (its tag is set here) and waits up to `timeout` for the
  // answer. A refusal in the answer (code != 0) comes back as that status.
  // Errors besides the call's own: UNAVAILABLE (the stream ended before
  // the answer, or the client is closing), DEADLINE_EXCEEDED.
  Answer Call(v1::StepStreamRequest req, absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);
  // The same without waiting: `done` gets what Call would return, exactly
  // once. It must not block (it may run on a gRPC thread), and runs with
  // no lock of the client held.
  void CallAsync(v1::StepStreamRequest req, absl::Duration timeout, Callback done)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Streams opened so far (a test's view of reconnection).
  int64_t streams_opened() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  class Stream;
  struct Waiter;

  // The open stream, making one when there is none or it broke; then
  // *fresh is set, and the caller starts it (Stream::Start) once mu_ is
  // released. Null when closing.
  std::shared_ptr<Stream> LiveLocked(bool* fresh) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes the waiter of `tag` out of the tables (null when it is gone:
  // answered, failed or expired already).
  std::unique_ptr<Waiter> TakeLocked(uint64_t tag) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The deadline thread: fails each call at its deadline and drops its
  // stream.
  void ExpireCalls() ABSL_LOCKS_EXCLUDED(mu_);

  v1::CoordinatorWorkers::Stub* const stub_;
  absl::Mutex mu_;  // the client's state, and every stream's
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<Stream> stream_ ABSL_GUARDED_BY(mu_);
  // Broken streams gRPC is not done with yet (kept until their OnDone).
  std::vector<std::shared_ptr<Stream>> retired_ ABSL_GUARDED_BY(mu_);
  uint64_t next_tag_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t opened_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint64_t, std::unique_ptr<Waiter>> waiting_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<absl::Time, uint64_t>> deadlines_ ABSL_GUARDED_BY(mu_);  // of waiting_
  // When the deadline thread wakes next; a call due before then wakes it.
  absl::Time expirer_wakes_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::CondVar earlier_deadline_;  // or closing
  std::thread expirer_;             // last: started once the members above exist
};

}  // namespace repvar::worker

#endif  // REPVAR_WORKER_RPC_STEP_STREAM_CLIENT_H_
