// SPDX-License-Identifier: Apache-2.0
#include "server/dedup.h"

#include "absl/strings/str_cat.h"

namespace repvar::server {

absl::StatusOr<std::optional<std::any>> DedupTable::Lookup(const RequestKey& key,
                                                           absl::string_view op, absl::Time now) {
  if (key.id.empty()) return std::optional<std::any>();
  absl::MutexLock lock(&mu_);
  EvictLocked(now);
  auto it = entries_.find(key.id);
  if (it == entries_.end()) return std::optional<std::any>();
  if (it->second.op != op || it->second.digest != key.digest) {
    return absl::InvalidArgumentError(
        absl::StrCat("request_id \"", key.id, "\" was already used for another ", it->second.op,
                     " request with a different payload; use a fresh request_id"));
  }
  return std::optional<std::any>(it->second.answer);
}

void DedupTable::Record(const RequestKey& key, absl::string_view op, std::any answer,
                        absl::Time now) {
  if (key.id.empty()) return;
  absl::MutexLock lock(&mu_);
  auto [it, inserted] =
      entries_.try_emplace(key.id, Entry{std::string(op), key.digest, std::move(answer), now});
  if (inserted) order_.push_back(key.id);
  EvictLocked(now);
}

void DedupTable::EvictLocked(absl::Time now) {
  while (!order_.empty()) {
    auto it = entries_.find(order_.front());
    bool too_many = entries_.size() > capacity_;
    bool too_old = it != entries_.end() && now - it->second.at > window_;
    if (!too_many && !too_old && it != entries_.end()) break;
    if (it != entries_.end()) entries_.erase(it);
    order_.pop_front();
  }
}

}  // namespace repvar::server
