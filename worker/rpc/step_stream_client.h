// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_WORKER_RPC_STEP_STREAM_CLIENT_H_
#define REPVAR_WORKER_RPC_STEP_STREAM_CLIENT_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "repvar/v1/coordinator.grpc.pb.h"

namespace repvar::worker {

// The worker's end of CoordinatorWorkers.StepStream: its step calls
// (GetStep, ReportStep, FinishStep) as tagged messages on one long-lived
// stream instead of a unary call each, every call waited for with its own
// deadline. Calls from many threads share the stream; one thread per
// stream reads the answers and hands each to the call with its tag.
//
//   none --(a call)--> open --(the coordinator ends it, or a call's answer
//                              does not come in time: cancelled)--> broken
//   broken --(the next call)--> a new stream opens; the broken one's calls
//                               still waiting fail UNAVAILABLE
//
// A call whose answer did not come in time drops the stream: an answer
// that is late may never come, and a later call should not queue behind it.
// Thread-safe.
class StepStreamClient {
 public:
  explicit StepStreamClient(v1::CoordinatorWorkers::Stub* stub) : stub_(stub) {}
  // Cancels the streams and waits for their readers; calls still waiting
  // fail UNAVAILABLE.
  ~StepStreamClient();
  StepStreamClient(const StepStreamClient&) = delete;
  StepStreamClient& operator=(const StepStreamClient&) = delete;

  // Sends `req` (its tag is set here) and waits up to `timeout` for the
  // answer. A refusal in the answer (code != 0) comes back as that status.
  // Errors besides the call's own: UNAVAILABLE (no stream could be opened,
  // or it broke before the answer), DEADLINE_EXCEEDED.
  absl::StatusOr<v1::StepStreamResponse> Call(v1::StepStreamRequest req, absl::Duration timeout);

  // Streams opened so far (a test's view of reconnection).
  int64_t streams_opened() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Stream;
  struct Waiter;

  // The open stream, opening one when there is none or it broke.
  // Errors: UNAVAILABLE (closing).
  absl::StatusOr<std::shared_ptr<Stream>> Live() ABSL_LOCKS_EXCLUDED(open_mu_, mu_);
  // The reader of `s`: hands each answer to its waiter; when the stream
  // ends, fails the waiters still on it.
  void ReadAnswers(Stream* s) ABSL_LOCKS_EXCLUDED(mu_);
  void BreakLocked(Stream& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  v1::CoordinatorWorkers::Stub* const stub_;
  absl::Mutex open_mu_ ABSL_ACQUIRED_BEFORE(mu_);  // one stream opens at a time
  absl::Mutex mu_;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<Stream> stream_ ABSL_GUARDED_BY(mu_);
  // Broken streams whose readers were not joined yet.
  std::vector<std::shared_ptr<Stream>> retired_ ABSL_GUARDED_BY(mu_);
  uint64_t next_tag_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t opened_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint64_t, Waiter*> waiting_ ABSL_GUARDED_BY(mu_);
};

}  // namespace repvar::worker

#endif  // REPVAR_WORKER_RPC_STEP_STREAM_CLIENT_H_
