// SPDX-License-Identifier: Apache-2.0
// The data plane in the simulation, behind the worker core's Collectives:
// the members of a collective meet by (group, tag) at a hub; once all are
// there the last to arrive moves the bytes (a broadcast copies the root's,
// an allreduce adds every member's, in rank order, in the accumulator
// type) and every member returns. A member that does not come within the
// collective's timeout, or a partition between members, fails it for all
// with UNAVAILABLE, as gloo's errors do.
#ifndef REPVAR_SIM_DATA_PLANE_H_
#define REPVAR_SIM_DATA_PLANE_H_

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/base/sync.h"
#include "sim/network.h"
#include "worker/core/data_plane.h"

namespace repvar::sim {

class DataPlaneHub {
 public:
  DataPlaneHub(Scheduler* scheduler, Network* network) : s_(scheduler), network_(network) {}

  // Where a collective's failure is told (a replay's trace).
  void SetTrace(std::function<void(const std::string&)> trace) { trace_ = std::move(trace); }

  enum class Kind { kBroadcast, kAllreduce };
  // Member `c.rank` of a collective, from node `node`, with its buffer:
  // returns once the collective is done or failed.
  absl::Status Meet(const CollectiveSpec& c, Kind kind, AccumType type, NodeId node,
                    std::span<std::byte> bytes);

 private:
  struct Meeting {
    Kind kind;
    AccumType type;
    std::vector<std::span<std::byte>> buffers;  // by rank
    std::vector<NodeId> nodes;
    int arrived = 0;
    size_t bytes = 0;  // the first member's buffer size (allreduce: everyone's)
    bool done = false;
    absl::Status status;
  };
  void Complete(Meeting& m, uint32_t root);

  Scheduler* const s_;
  Network* const network_;
  std::function<void(const std::string&)> trace_;
  Mutex mu_;
  std::map<std::pair<std::string, uint32_t>, std::shared_ptr<Meeting>> meetings_
      ABSL_GUARDED_BY(mu_);
};

class SimCollectives final : public worker::Collectives {
 public:
  SimCollectives(DataPlaneHub* hub, NodeId node) : hub_(hub), node_(node) {}

  absl::Status Broadcast(const CollectiveSpec& c, std::span<std::byte> bytes,
                         ChecksumStream* received, worker::ArrivingBytes* arriving) override;
  absl::Status Allreduce(const CollectiveSpec& c, AccumType type,
                         std::span<std::byte> bytes) override;

 private:
  DataPlaneHub* const hub_;
  const NodeId node_;
};

}  // namespace repvar::sim

#endif  // REPVAR_SIM_DATA_PLANE_H_
