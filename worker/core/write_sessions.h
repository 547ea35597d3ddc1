// SPDX-License-Identifier: Apache-2.0
// Receiving tensors as chunk streams: a sequence of headers, each followed
// by its chunks (or carrying its bytes inline, or naming a data-plane
// collective). Nothing is applied until the stream ends with every tensor
// verified; then all of its writes are applied together, or none. The
// adapters only translate messages into these calls.
#ifndef REPVAR_WORKER_CORE_WRITE_SESSIONS_H_
#define REPVAR_WORKER_CORE_WRITE_SESSIONS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "common/base/thread_pool.h"
#include "common/model/replica_write.h"
#include "common/model/step.h"
#include "common/tensor/chunk_assembler.h"
#include "worker/core/data_plane.h"
#include "worker/core/replica_store.h"
#include "worker/core/step_table.h"

namespace repvar::worker {

// The coordinator's cross-replica writes to this worker (C2). A write
// carrying another incarnation is refused (ABORTED): it was meant for an
// earlier process. A header with a collective is delivered by the data
// plane: the root gets the bytes here and sends them on as they come (its
// broadcast starts at the header, on a thread of `root_broadcasts`, and
// sends each part once its chunks are in), the other members receive them
// from the root; every member checks the checksum. Not thread-safe: one per
// stream.
class ReplicaWriteSession {
 public:
  // `data_plane` may be null: writes naming a collective are then refused;
  // with one, `root_broadcasts` runs this worker's broadcasts as a root.
  // Tensors being received are charged to `budget` (null: unbounded) until
  // the session ends.
  ReplicaWriteSession(uint64_t incarnation, ReplicaStore* store, Collectives* data_plane,
                      MemoryBudget* budget = nullptr, ThreadPool* root_broadcasts = nullptr);
  // A root's broadcast still running is told its bytes will not come, and
  // waited for.
  ~ReplicaWriteSession();
  ReplicaWriteSession(const ReplicaWriteSession&) = delete;
  ReplicaWriteSession& operator=(const ReplicaWriteSession&) = delete;

  // Errors: ABORTED (another incarnation), INVALID_ARGUMENT (bad header,
  // chunk or checksum), FAILED_PRECONDITION (no data plane), UNAVAILABLE or
  // DATA_LOSS (the data plane failed). Nothing is applied after an error.
  absl::Status OnHeader(ReplicaWriteHeader h, std::span<const std::byte> inline_data);
  // A chunk of `size` bytes that `fill` copies into place (ChunkAssembler::Add).
  absl::Status OnChunk(uint64_t offset, size_t size, uint64_t checksum,
                       absl::FunctionRef<void(std::span<std::byte>)> fill);
  // Applies every write of the stream; returns the checksum of the last one
  // as verified here (0 when there was none).
  absl::StatusOr<uint64_t> Finish();

 private:
  absl::Status FinishCurrent();

  const uint64_t incarnation_;
  ReplicaStore* const store_;
  Collectives* const data_plane_;
  MemoryBudget* const budget_;
  ThreadPool* const root_broadcasts_;
  std::vector<ReplicaWrite> items_;
  std::vector<MemoryCharge> charges_;  // of items_, until they are applied
  std::optional<ChunkAssembler> assembler_;
  std::optional<ReplicaWriteHeader> header_;
  // The root's broadcast of the tensor assembler_ fills (write_sessions.cc).
  // After assembler_: it goes first.
  class RootBroadcast;
  std::unique_ptr<RootBroadcast> broadcast_;
};

// The coordinator's small writes in one message (WriteSmallReplicas), each
// value whole: checked as a stream's writes are (incarnation, every field,
// each value's size and checksum), charged to `budget` (null: unbounded)
// while they are copied in, then applied together, or none. Writes that
// share a value in the message share one copy here. Returns the
// checksum of the last write as verified here (0 when there was none).
// Errors: as ReplicaWriteSession, RESOURCE_EXHAUSTED (the budget).
absl::StatusOr<uint64_t> ApplySmallWrites(uint64_t incarnation, SmallReplicaWrites writes,
                                          ReplicaStore* store, MemoryBudget* budget = nullptr);

// A trainer's stream of in-step writes of one step (S2). Not thread-safe:
// one per stream.
class StepWriteSession {
 public:
  explicit StepWriteSession(StepTable* steps, MemoryBudget* budget = nullptr)
      : steps_(steps), budget_(budget) {}

  // Errors: INVALID_ARGUMENT (bad header, chunk or checksum, a second step
  // in one stream); the step table's refusals at Finish().
  absl::Status OnHeader(const StepWriteHeader& h, std::span<const std::byte> inline_data);
  // A chunk of `size` bytes that `fill` copies into place (ChunkAssembler::Add).
  absl::Status OnChunk(uint64_t offset, size_t size, uint64_t checksum,
                       absl::FunctionRef<void(std::span<std::byte>)> fill);
  absl::Status Finish();

 private:
  absl::Status FinishCurrent();

  StepTable* const steps_;
  MemoryBudget* const budget_;
  std::optional<StepWriteHeader> first_;
  std::vector<StepTable::WriteItem> items_;
  std::vector<MemoryCharge> charges_;
  std::optional<ChunkAssembler> assembler_;
  std::optional<StepWriteHeader> header_;
};

}  // namespace repvar::worker

#endif  // REPVAR_WORKER_CORE_WRITE_SESSIONS_H_
