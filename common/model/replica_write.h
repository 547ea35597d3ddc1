// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_COMMON_MODEL_REPLICA_WRITE_H_
#define REPVAR_COMMON_MODEL_REPLICA_WRITE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/model/collective.h"
#include "common/tensor/tensor.h"

namespace repvar {

// What a worker holds of a variable, as it asks the coordinator whether that
// is the committed value (docs/architecture.md, "Local reads").
struct HeldValue {
  uint64_t variable_id = 0;
  int32_t replica = 0;
  int64_t version = 0;
  uint64_t checksum = 0;
  friend bool operator==(const HeldValue&, const HeldValue&) = default;
};
// At most this many per heartbeat.
inline constexpr size_t kMaxHeldValuesPerHeartbeat = 4096;

// "Version `version` of variable `variable_id` is `value`" for some of the
// replicas one worker holds: what the coordinator sends and a worker applies.
struct ReplicaWrite {
  uint64_t variable_id = 0;
  std::string name;
  int64_t version = 0;
  std::vector<int32_t> replicas;
  std::shared_ptr<const Tensor> value;
  // The coordinator's fencing token (Registry::NextFence): larger for every
  // later write, across coordinator restarts. A worker refuses a write of a
  // variable whose token is below one it already applied for that
  // variable, so a write delayed past its own failure (a paused worker, a
  // coordinator that crashed before committing it) can never land on top of
  // the repair that followed. 0 only for a worker's own installs of a
  // step's result.
  uint64_t fence = 0;
  // Set when the bytes travel worker to worker over the data plane.
  std::optional<CollectiveSpec> collective;
};

// What a worker receives ahead of a write's bytes: the write (without its
// value), the tensor it announces and the incarnation it is meant for.
struct ReplicaWriteHeader {
  uint64_t incarnation = 0;
  ReplicaWrite write;  // value unset
  TensorHeader tensor;
};

// Many small writes to one worker with their values whole, as one message
// brings them (WriteSmallReplicas): each value is a view into that message,
// which must outlive this.
struct SmallReplicaWrites {
  struct Item {
    ReplicaWrite write;     // value unset
    size_t spec = 0;        // index into `specs`
    uint64_t checksum = 0;  // as sent; 0: not given
    // Its value: the value-th distinct one of the batch (numbered in order
    // of first use; writes with the same number share the bytes).
    size_t value = 0;
    std::span<const std::byte> bytes;
  };
  uint64_t incarnation = 0;
  std::vector<TensorSpec> specs;  // distinct
  std::vector<Item> items;
};

}  // namespace repvar

#endif  // REPVAR_COMMON_MODEL_REPLICA_WRITE_H_
