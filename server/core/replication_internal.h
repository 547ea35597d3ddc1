// SPDX-License-Identifier: Apache-2.0
// What replication.cc (writes), initialize.cc, reads.cc and repair.cc
// (verification and resync) share: the per-variable write locks, the
// live-holder filter and the lookup of a name.
// Not part of Replication's interface.
#ifndef REPVAR_SERVER_CORE_REPLICATION_INTERNAL_H_
#define REPVAR_SERVER_CORE_REPLICATION_INTERNAL_H_

#include <algorithm>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/base/sync.h"
#include "server/core/cluster_state.h"
#include "server/core/replication.h"

namespace repvar::server {

// A name that names no variable.
inline absl::Status VariableNotFound(absl::string_view name) {
  return absl::NotFoundError(absl::StrCat("variable \"", name, "\" does not exist"));
}

// The id of the variable `name`. Errors: NOT_FOUND.
inline absl::StatusOr<uint64_t> IdIn(const ClusterState& s, absl::string_view name) {
  const VariableRecord* v = s.Find(name);
  if (v == nullptr) return VariableNotFound(name);
  return v->id;
}

// Takes the write locks of variables in id order, so that batches never
// deadlock, before any ranked lock (lock_order.h); releases them when it
// goes out of scope.
class Replication::WriteLocks {
 public:
  WriteLocks(Replication* r, std::vector<uint64_t> ids) {
    RankedMutex::AssertNoneHeld("variable write locks");
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    mutexes_ = r->WriteLocksOf(ids);
    held_.reserve(mutexes_.size());
    for (const auto& mu : mutexes_) {
      held_.push_back(std::make_unique<MutexLock>(mu.get()));  // in id order, as every taker
    }
  }
  ~WriteLocks() {
    while (!held_.empty()) held_.pop_back();  // in reverse order
  }
  WriteLocks(const WriteLocks&) = delete;
  WriteLocks& operator=(const WriteLocks&) = delete;

 private:
  std::vector<std::shared_ptr<Mutex>> mutexes_;
  std::vector<std::unique_ptr<MutexLock>> held_;  // one per mutex
};

}  // namespace repvar::server

#endif  // REPVAR_SERVER_CORE_REPLICATION_INTERNAL_H_
