// SPDX-License-Identifier: Apache-2.0
#include "server/core/rendezvous_store.h"

#include "absl/strings/str_cat.h"

namespace repvar::server {

absl::Status RendezvousStore::Set(const std::string& key, std::string value) {
  if (key.empty()) return absl::InvalidArgumentError("store key is empty");
  if (value.size() > kMaxValueBytes) {
    return absl::InvalidArgumentError(absl::StrCat("store value over ", kMaxValueBytes, " bytes"));
  }
  RankedLock lock(&mu_);
  if (kv_.size() >= kMaxKeys && !kv_.contains(key)) {
    return absl::ResourceExhaustedError("rendezvous store is full");
  }
  kv_[key] = std::move(value);
  return absl::OkStatus();
}

absl::StatusOr<std::string> RendezvousStore::Get(const std::string& key,
                                                 absl::Time deadline) const {
  RankedLock lock(&mu_);
  auto present = [this, &key]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return kv_.contains(key); };
  if (!mu_.native()->AwaitWithDeadline(absl::Condition(&present), deadline)) {
    return absl::DeadlineExceededError(absl::StrCat("store key \"", key, "\" never arrived"));
  }
  return kv_.at(key);
}

void RendezvousStore::DeletePrefix(const std::string& prefix) {
  RankedLock lock(&mu_);
  for (auto it = kv_.lower_bound(prefix); it != kv_.end() && it->first.starts_with(prefix);) {
    it = kv_.erase(it);
  }
}

size_t RendezvousStore::size() const {
  RankedLock lock(&mu_);
  return kv_.size();
}

}  // namespace repvar::server
