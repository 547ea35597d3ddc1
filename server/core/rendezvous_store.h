// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_SERVER_CORE_RENDEZVOUS_STORE_H_
#define REPVAR_SERVER_CORE_RENDEZVOUS_STORE_H_

#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/ranked_mutex.h"
#include "server/core/lock_order.h"

namespace repvar::server {

// The key-value store workers rendezvous through when they build a gloo
// context (gloo::rendezvous::Store semantics: set, then blocking get).
// Bounded: keys and values are small, and the coordinator deletes a group's
// keys when the group is replaced. Thread-safe.
class RendezvousStore {
 public:
  static constexpr size_t kMaxValueBytes = 64 << 10;
  static constexpr size_t kMaxKeys = 1 << 16;

  // Errors: INVALID_ARGUMENT (empty key, value too large),
  // RESOURCE_EXHAUSTED (too many keys).
  absl::Status Set(const std::string& key, std::string value) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until `key` exists or `deadline`. Errors: DEADLINE_EXCEEDED.
  absl::StatusOr<std::string> Get(const std::string& key, absl::Time deadline) const
      ABSL_LOCKS_EXCLUDED(mu_);
  void DeletePrefix(const std::string& prefix) ABSL_LOCKS_EXCLUDED(mu_);
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable RankedMutex mu_{kLeafRank, "RendezvousStore::mu_"};
  std::map<std::string, std::string> kv_ ABSL_GUARDED_BY(mu_);
};

}  // namespace repvar::server

#endif  // REPVAR_SERVER_CORE_RENDEZVOUS_STORE_H_
