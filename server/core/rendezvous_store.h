// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_SERVER_CORE_RENDEZVOUS_STORE_H_
#define REPVAR_SERVER_CORE_RENDEZVOUS_STORE_H_

#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/base/ranked_mutex.h"
#include "common/base/sync.h"
#include "server/core/lock_order.h"

namespace repvar::server {

// The key-value store workers rendezvous through when they build a gloo
// context (gloo::rendezvous::Store semantics: set, then blocking get).
// Bounded in keys, key and value length and total bytes; an entry lives for
// `ttl` after it was set (a gloo context is built within seconds), and the
// coordinator deletes a group's keys when the group is replaced.
// Thread-safe.
class RendezvousStore {
 public:
  static constexpr size_t kMaxKeyBytes = 512;
  static constexpr size_t kMaxValueBytes = 64 << 10;
  static constexpr size_t kMaxKeys = 1 << 16;
  static constexpr size_t kMaxTotalBytes = 64 << 20;

  explicit RendezvousStore(Clock* clock = RealClock::Get(), absl::Duration ttl = absl::Minutes(10))
      : clock_(clock), ttl_(ttl) {}

  // Errors: INVALID_ARGUMENT (empty or long key, value too large),
  // RESOURCE_EXHAUSTED (too many keys or bytes that have not expired).
  absl::Status Set(const std::string& key, std::string value) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until `key` exists (and has not expired) or `deadline`. Errors:
  // INVALID_ARGUMENT (empty or long key), DEADLINE_EXCEEDED.
  absl::StatusOr<std::string> Get(const std::string& key, absl::Time deadline) const
      ABSL_LOCKS_EXCLUDED(mu_);
  void DeletePrefix(const std::string& prefix) ABSL_LOCKS_EXCLUDED(mu_);
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry {
    std::string value;
    absl::Time expires;
  };
  void DropExpired(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Clock* const clock_;
  const absl::Duration ttl_;
  mutable RankedMutex mu_{kLeafRank, "RendezvousStore::mu_"};
  std::map<std::string, Entry> kv_ ABSL_GUARDED_BY(mu_);
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;  // keys and values
};

}  // namespace repvar::server

#endif  // REPVAR_SERVER_CORE_RENDEZVOUS_STORE_H_
