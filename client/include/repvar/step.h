// SPDX-License-Identifier: Apache-2.0
// Replicated steps from a trainer (docs/contract.md S1-S5): inside a StepScope the
// trainer reads and writes its own host's replicas through the local worker
// (no byte crosses hosts), then commits; the worker reports, the step's
// barrier resolves, and the replicas are aggregated per variable.
//
//   auto scope = repvar::StepScope::Begin(*client, step, {.worker = "tpu_worker:0"});
//   for (int32_t r : (*scope)->LocalReplicas("w"))  // this host's replicas of w
//     (*scope)->Write<float>("w", r, new_value_of_replica_r);
//   auto result = (*scope)->Commit();               // the same for every trainer
//
// A scope destroyed without a successful Commit aborts the step: every
// replica stays exactly as committed.
#ifndef REPVAR_STEP_H_
#define REPVAR_STEP_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "repvar/client.h"

namespace repvar {

// One step event as the coordinator's watch stream reports it.
struct StepEventInfo {
  enum class Kind { kBegun = 1, kReported = 2, kStragglers = 3, kAggregating = 4, kResolved = 5 };
  int64_t seq = 0;
  Kind kind = Kind::kBegun;
  int64_t step = 0;
  uint64_t epoch = 0;
  std::string task;                  // kReported: "job:task"
  std::vector<std::string> missing;  // kStragglers
  bool committed = false;            // kResolved
  std::string error;                 // kResolved and failed
};

struct StepOptions {
  // The trainer's host: the worker task "job:task" whose replicas it maps.
  // Empty: $REPVAR_WORKER ("job:task").
  std::string worker;
  // The step's barrier timeout (the first step includes compilation).
  absl::Duration barrier_timeout = absl::Seconds(60);
  // Devices this trainer commits ("TPU:0"); empty: every device of its host
  // (one trainer per host). With one trainer per device, each names its own.
  std::vector<std::string> devices;
  // Called, from another thread, with this step's events while Commit waits:
  // STRAGGLERS at half the barrier timeout (who is missing), RESOLVED.
  std::function<void(const StepEventInfo&)> on_event;
};

struct StepDivergence {
  std::string variable;
  std::vector<uint64_t> replica_checksums;
  uint64_t chosen_checksum = 0;  // the majority; ties go to the primary
  std::vector<int32_t> repaired;
};

struct StepChange {
  std::string variable;
  int64_t version = 0;
  uint64_t checksum = 0;
};

// A committed step's resolution, the same for every trainer of a host:
// `changed` lists the variables this host holds that the step changed. How
// long each worker took to report is the coordinator's (GetStepsSummary).
struct StepResult {
  int64_t step = 0;
  uint64_t epoch = 0;
  std::vector<StepChange> changed;
  std::vector<StepDivergence> divergences;
};

// A local replica mapped into this process: the worker's own shared buffer,
// read or written in place (no copy through a socket). A write mapping counts
// only once published (StepScope::Publish). bytes() is valid until the
// mapping is published or destroyed, and not after: the client keeps the
// mapping itself for the buffer's next lease (ClientOptions::
// mapping_cache_bytes), when the same memory may be another step's value.
class LocalMapping {
 public:
  ~LocalMapping();
  LocalMapping(const LocalMapping&) = delete;
  LocalMapping& operator=(const LocalMapping&) = delete;

  const std::string& variable() const;
  int32_t replica() const;
  bool writable() const;
  // Of the bytes as lent (kRead, kUpdate) and the replica's committed version.
  uint64_t checksum() const;
  int64_t version() const;
  std::span<std::byte> bytes();  // read-only memory unless writable()
  std::span<const std::byte> bytes() const;
  template <typename T>
  std::span<T> as() {
    auto b = bytes();
    return {reinterpret_cast<T*>(b.data()), b.size() / sizeof(T)};
  }

 private:
  friend class StepScope;
  class Impl;
  explicit LocalMapping(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

enum class MapMode {
  kRead,    // the step's view of the replica, read-only
  kWrite,   // a buffer to fill entirely, then Publish
  kUpdate,  // the step's view, writable in place, then Publish
};

class StepScope {
 public:
  // S1: begins `step` (idempotent for the open step: every trainer calls it).
  // Errors: FAILED_PRECONDITION (another step open, or `step` not above the
  // last committed), INVALID_ARGUMENT (no worker given), NOT_FOUND (the
  // worker task is not live).
  static absl::StatusOr<std::unique_ptr<StepScope>> Begin(Client& client, int64_t step,
                                                          StepOptions options = {});
  // Aborts the step unless it was committed.
  ~StepScope();
  StepScope(const StepScope&) = delete;
  StepScope& operator=(const StepScope&) = delete;

  int64_t step() const;
  uint64_t epoch() const;
  // Variables in the step (created or initialized later join the next one).
  std::vector<std::string> Variables() const;
  // This host's replicas of `name` that take part in the step.
  absl::StatusOr<std::vector<int32_t>> LocalReplicas(const std::string& name) const;

  // S2: this step's view of a local replica: its own writes, else the
  // committed value. From 1 MiB through a mapping of the worker's buffer
  // (where it can be mapped), up to 64 KiB in one unary call, and through
  // a stream between.
  absl::StatusOr<TensorValue> Read(const std::string& name, int32_t replica);
  // The same view written straight into `out`, which must be exactly its
  // size: one copy of each byte (from the worker's mapped buffer, or from
  // its socket, checked against the chunk sums and the value's checksum),
  // and nothing of the value's size allocated (Client::ReadInto's in-step
  // twin). Errors: as Read's, and INVALID_ARGUMENT (`out` is not the value's
  // size; untouched). After any other error `out`'s contents are
  // unspecified.
  absl::StatusOr<ReadInfo> ReadInto(const std::string& name, int32_t replica,
                                    std::span<std::byte> out);
  // S2: writes a step-local copy (the committed replica is untouched until
  // the step commits). Errors: FAILED_PRECONDITION (not in the step, or the
  // step is no longer open), NOT_FOUND (not a local replica),
  // INVALID_ARGUMENT (size or dtype).
  absl::Status Write(const std::string& name, int32_t replica, std::span<const std::byte> bytes);
  template <typename T>
  absl::Status Write(const std::string& name, int32_t replica, std::span<const T> values) {
    return Write(name, replica, std::as_bytes(values));
  }
  // S2 in place: maps the worker's buffer of a local replica into this
  // process (same host only: FAILED_PRECONDITION when the worker's memory
  // cannot be mapped from here, e.g. another container; Read/Write then
  // still work through the worker's socket).
  absl::StatusOr<std::unique_ptr<LocalMapping>> Map(const std::string& name, int32_t replica,
                                                    MapMode mode);
  // Makes a kWrite/kUpdate mapping the replica's step-local copy. Returns
  // before the worker has hashed the bytes (it does next); a Read or Map of
  // that replica in this step, and the Commit, wait for the hash.
  absl::Status Publish(std::unique_ptr<LocalMapping> mapping);

  // Many small local writes in one call, applied together or not at all
  // (items over 64 KiB are written one by one first, as Write does).
  struct LocalWrite {
    std::string name;
    int32_t replica = 0;
    std::span<const std::byte> bytes;
  };
  absl::Status WriteBatch(const std::vector<LocalWrite>& writes);

  // S2 for many local replicas: each value as Read gives it, in the order
  // asked. The small ones (64 KiB at most) come from the worker together,
  // in one call for up to 2 MiB of them (StepReadSmall), where Read makes a
  // call each; larger ones are read as Read reads them. Errors: Read's, for
  // the first read refused; nothing is returned then.
  struct LocalRead {
    std::string name;
    int32_t replica = 0;
  };
  absl::StatusOr<std::vector<TensorValue>> ReadBatch(const std::vector<LocalRead>& reads);

  // S3/S4: commits this trainer's devices and waits for the resolution. A
  // failed step is returned as its error (ABORTED, DEADLINE_EXCEEDED naming
  // the missing workers, UNAVAILABLE naming a dead worker, INVALID_ARGUMENT
  // for a non-finite result, ...); the scope is then closed either way.
  absl::StatusOr<StepResult> Commit();
  // Ends the step for everyone with ABORTED. Idempotent.
  absl::Status Abort(const std::string& reason = "");

 private:
  class Impl;
  explicit StepScope(std::unique_ptr<Impl> impl);
  absl::Status PublishMapping(std::unique_ptr<LocalMapping> mapping,
                              std::optional<uint64_t> checksum);
  // Read's and ReadInto's one path: the step's view into `out` (the value's
  // size), or into `*grow` when given.
  absl::StatusOr<ReadInfo> ReadView(const std::string& name, int32_t replica,
                                    std::span<std::byte> out, std::vector<std::byte>* grow);
  std::unique_ptr<Impl> impl_;
};

// The last committed step id (0 before the first): training resumes above it.
absl::StatusOr<int64_t> LastCommittedStep(Client& client);

// Streams step events after `after_seq` (kStepEventsFromNow: only those to
// come) to `fn` until it returns false or `timeout` passes (F1: trainers
// learn of failures here).
inline constexpr int64_t kStepEventsFromNow = -1;
absl::Status WatchSteps(Client& client, int64_t after_seq, absl::Duration timeout,
                        const std::function<bool(const StepEventInfo&)>& fn);

// The open step's progress per participant and the last resolutions, as
// text lines (repvarctl steps).
absl::StatusOr<std::vector<std::string>> DescribeSteps(Client& client);

// The same, as data (repvarctl --json steps; StepsSummary is in client.h).
absl::StatusOr<StepsSummary> GetStepsSummary(Client& client);

}  // namespace repvar

#endif  // REPVAR_STEP_H_
