// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_SERVER_CORE_COLLECTIVE_GROUPS_H_
#define REPVAR_SERVER_CORE_COLLECTIVE_GROUPS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "common/base/ranked_mutex.h"
#include "common/model/task.h"
#include "server/core/lock_order.h"
#include "server/core/rendezvous_store.h"

namespace repvar::server {

// A data-plane group member: a worker task and its incarnation.
struct GroupMember {
  TaskKey task;
  uint64_t incarnation = 0;
};

// The data plane's groups (docs/architecture.md). gloo needs every member of a group
// to issue the same collectives in the same order, so the coordinator names
// each group (its member set and a generation), hands out tags in order and
// runs cross-replica broadcasts one at a time; after a failure it moves to a
// new generation, because gloo leaves a failed context unusable. It also
// keeps the rendezvous store workers build their contexts through; a group's
// keys are deleted when another group replaces it.
//
// Thread-safe (a monitor, rank kGroupsRank).
class CollectiveGroups {
 public:
  // `life` tells this coordinator process's groups from those of an
  // earlier one (the clock in microseconds at its start): a restart must
  // never hand out a (group, tag) that workers may still hold from before
  // it, with members waiting in a collective that will never complete.
  explicit CollectiveGroups(uint64_t life) : life_(life) {}

  RendezvousStore& store() { return store_; }

  // A cross-replica write over the data plane among `members` (in rank
  // order): `run(group, tag)` runs under the groups lock, so collectives
  // never interleave; when it fails, the next collective starts a new
  // generation. Returns what `run` returns.
  absl::Status RunBroadcast(
      const std::vector<GroupMember>& members,
      absl::FunctionRef<absl::Status(const std::string& group, uint32_t tag)> run)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A step's collectives among `members`: the group and the first of
  // `count` consecutive tags. `fresh`: the last step's collectives failed,
  // so start a new generation.
  std::pair<std::string, uint32_t> ForStep(const std::vector<GroupMember>& members, size_t count,
                                           bool fresh) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // The group name of a member set in the current generation; a new group
  // deletes the previous one's rendezvous keys.
  std::string GroupLocked(const std::vector<GroupMember>& members)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t life_;
  RendezvousStore store_;

  // State below is protected by mu_.
  RankedMutex mu_{kGroupsRank, "CollectiveGroups::mu_"};
  std::string group_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t next_tag_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace repvar::server

#endif  // REPVAR_SERVER_CORE_COLLECTIVE_GROUPS_H_
