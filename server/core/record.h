// SPDX-License-Identifier: Apache-2.0
// Records: every change of the coordinator's state that must survive a
// restart, as data. Callers build a Record; Registry::Commit appends it to the
// StateLog and hands it to ClusterState::Apply, the only code that changes
// that state (LevelDB's DBImpl::Write: the log first, then the memtable; one
// path whoever calls). A record's changes apply together, in order.
#ifndef REPVAR_SERVER_CORE_RECORD_H_
#define REPVAR_SERVER_CORE_RECORD_H_

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/time/time.h"
#include "common/model/device_name.h"
#include "common/model/initializer.h"
#include "common/model/step.h"
#include "common/model/task.h"
#include "common/model/variable.h"
#include "common/tensor/tensor.h"

namespace repvar::server {

// A mutating request's identity: the caller's id and a digest of its payload.
struct RequestKey {
  std::string id;       // empty: not deduplicated
  uint64_t digest = 0;  // the same id with another digest is refused
};

// What a retry of a mutating request gets back (C6). Versions and checksums,
// never tensor bytes.
struct CreateAnswer {
  std::vector<std::string> names;
  std::vector<bool> created;
  std::vector<std::string> warnings;
};
struct WriteOutcome {
  int64_t version = 0;
  uint64_t checksum = 0;
};
using Answer = std::variant<std::monostate,  // delete
                            CreateAnswer, std::vector<InitializeResult>, std::vector<WriteOutcome>>;

// A replica that acknowledged holding a value, and the incarnation of the
// worker that holds it.
struct Holder {
  int32_t replica = 0;
  uint64_t incarnation = 0;
};

// The replicas that acknowledged a value: those `listed`, each by the
// incarnation that did; or (`all_but`, a step's form, whose size does not
// grow with the replicas) every replica except those in `missing`, each by
// its worker's incarnation, which is live.
struct Holders {
  Holders() = default;
  Holders(std::vector<Holder> l) : listed(std::move(l)) {}  // NOLINT: a list converts
  Holders(std::initializer_list<Holder> l) : listed(l) {}
  static Holders AllBut(std::vector<int32_t> missing) {
    Holders h;
    h.all_but = true;
    h.missing = std::move(missing);
    return h;
  }

  std::vector<Holder> listed;
  bool all_but = false;
  std::vector<int32_t> missing;  // all_but: sorted
};

// Changes. Each names what happened, with what Apply needs to redo it.
struct WorkerRegistered {
  TaskKey task;
  std::string address;
  uint64_t incarnation = 0;
  std::vector<DeviceName> devices;  // sorted
  // Out of the topology until a WorkerJoined: its replicas are being
  // verified and resynced (F2). A restart in between finishes the join.
  bool joining = false;
};
struct WorkerDied {
  TaskKey task;
  uint64_t incarnation = 0;
};
// A registered worker's replicas were verified and resynced: from now it is
// listed in the topology (a new topology version).
struct WorkerJoined {
  TaskKey task;
  uint64_t incarnation = 0;
};
struct VariableCreated {
  uint64_t id = 0;
  VariableDef def;
  Placements placement;  // replica i on placement[i]
  Initializer initializer;
};
struct VariableDeleted {
  uint64_t id = 0;
};
// A new committed value (initialize, assign, a step that changed it) and the
// replicas that acknowledged holding it; every other replica missed it.
struct ValueCommitted {
  uint64_t id = 0;
  int64_t version = 0;
  uint64_t checksum = 0;
  // The value, when the coordinator keeps it (cross-replica writes); null
  // when only the replicas hold it (a step changed it).
  std::shared_ptr<const Tensor> value;
  Holders holders;
  // Initialize with an initializer of its own: it replaces the one given at
  // create.
  std::optional<Initializer> initializer;
};
// The committed value of a variable that only its replicas held (a step
// changed it), kept by the coordinator from now: recorded before a
// cross-replica write overwrites those replicas, so that a write that fails
// or is never recorded cannot take the committed value with it.
struct ValueKept {
  uint64_t id = 0;
  int64_t version = 0;
  uint64_t checksum = 0;
  std::shared_ptr<const Tensor> value;
};
// Replicas that now hold (version, checksum): the committed value again (a
// resync, a step's repair) or an uncommitted one (a write that failed
// elsewhere).
struct ReplicasWritten {
  uint64_t id = 0;
  int64_t version = 0;
  uint64_t checksum = 0;
  Holders holders;
};
struct ResyncFlagged {
  uint64_t id = 0;
  bool needs_resync = false;
};
struct StepBegun {
  int64_t step = 0;
  uint64_t epoch = 0;
};
// The step's variable changes ride in the same record (ValueCommitted,
// ReplicasWritten): one record, one fsync, per step (docs/architecture.md).
// `changed` is the resolution's list of changed variables: a worker that
// did not hear how the step ended (the coordinator restarted after this
// record) is told from it, and installs its values (two-phase commit).
struct StepCommitted {
  int64_t step = 0;
  uint64_t epoch = 0;
  std::vector<CommittedVariable> changed;
};
struct StepFailed {
  int64_t step = 0;
  uint64_t epoch = 0;
};
// Fencing tokens up to `up_to` may be handed out (Registry::NextFence).
// Reserved in blocks so that a token is never handed out twice, across
// restarts too, without a record per write (Percolator's timestamp oracle).
struct FencesReserved {
  uint64_t up_to = 0;
};
struct RequestRecorded {
  RequestKey key;
  std::string op;
  Answer answer;
  absl::Time at;
};
// A cross-replica write of small values, recorded before the values leave
// for the workers, and synced while they travel: once it is durable the
// write is decided. Its commit (ValueCommitted + the answer + WriteResolved)
// is then applied and answered without waiting for its own sync, since a
// restart that finds the write unresolved commits it (roll-forward,
// Registry::Recover) to the same version, checksum and answer; the
// replicas are verified then. A write that fails resolves it in a record
// that is synced before the caller hears of the failure.
struct PreparedValue {
  uint64_t id = 0;
  int64_t version = 0;
  uint64_t checksum = 0;
  std::shared_ptr<const Tensor> value;
};
struct WritePrepared {
  uint64_t fence = 0;  // the write's fencing token: unique, never reused
  std::vector<PreparedValue> values;
  RequestRecorded outcome;  // the answer once committed (C6)
};
struct WriteResolved {
  uint64_t fence = 0;
};

using Change = std::variant<WorkerRegistered, WorkerDied, VariableCreated, VariableDeleted,
                            ValueCommitted, ReplicasWritten, ResyncFlagged, StepBegun,
                            StepCommitted, StepFailed, RequestRecorded, FencesReserved,
                            WorkerJoined, ValueKept, WritePrepared, WriteResolved>;

struct Record {
  std::vector<Change> changes;
  bool empty() const { return changes.empty(); }
};

}  // namespace repvar::server

#endif  // REPVAR_SERVER_CORE_RECORD_H_
