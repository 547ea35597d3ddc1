// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_SERVER_DEDUP_H_
#define REPVAR_SERVER_DEDUP_H_

#include <any>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace repvar::server {

// A mutating request's identity: the caller's id and a digest of its payload.
struct RequestKey {
  std::string id;       // empty: not deduplicated
  uint64_t digest = 0;  // same id with another digest is refused
};

// Remembers the answers of successful mutating requests so that a retry gets
// the original answer (C6). Bounded in count and age. Thread-safe.
class DedupTable {
 public:
  DedupTable(size_t capacity, absl::Duration window) : capacity_(capacity), window_(window) {}

  // The remembered answer, nullopt when unknown. Errors: INVALID_ARGUMENT when
  // the id was used for another operation or payload.
  absl::StatusOr<std::optional<std::any>> Lookup(const RequestKey& key, absl::string_view op,
                                                 absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  void Record(const RequestKey& key, absl::string_view op, std::any answer, absl::Time now)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry {
    std::string op;
    uint64_t digest;
    std::any answer;
    absl::Time at;
  };
  void EvictLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t capacity_;
  const absl::Duration window_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> order_ ABSL_GUARDED_BY(mu_);
};

}  // namespace repvar::server

#endif  // REPVAR_SERVER_DEDUP_H_
