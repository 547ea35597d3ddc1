// SPDX-License-Identifier: Apache-2.0
// What the parts of Replication share: construction, the per-variable
// write locks and the lookup of a name. The parts: replication_write.cc
// (assign, delete), replication_initialize.cc, replication_read.cc and
// replication_repair.cc (verification and resync); their pure decisions
// are in replication_plan.h.
#include "server/core/replication.h"

#include "server/core/replication_internal.h"

namespace repvar::server {

Replication::Replication(ReplicationOptions options, Clock* clock, Registry* registry,
                         StateLog* log, StepCoordinator* steps, CollectiveGroups* groups,
                         WorkerClient* workers, MemoryBudget* budget)
    : options_(options),
      clock_(clock),
      registry_(registry),
      log_(log),
      steps_(steps),
      groups_(groups),
      workers_(workers),
      budget_(budget) {}

std::vector<std::shared_ptr<Mutex>> Replication::WriteLocksOf(const std::vector<uint64_t>& ids) {
  std::vector<std::shared_ptr<Mutex>> out;
  out.reserve(ids.size());
  RankedLock lock(&mu_);
  for (uint64_t id : ids) {
    auto& mu = write_locks_[id];
    if (mu == nullptr) mu = std::make_shared<Mutex>();
    out.push_back(mu);
  }
  return out;
}

absl::StatusOr<uint64_t> Replication::IdOf(absl::string_view name) const {
  return registry_->Read([&](const ClusterState& s) { return IdIn(s, name); });
}

}  // namespace repvar::server
