// SPDX-License-Identifier: Apache-2.0
#include "server/core/rendezvous_store.h"

#include "absl/strings/str_cat.h"
#include "common/base/status_util.h"

namespace repvar::server {

void RendezvousStore::DropExpired(absl::Time now) {
  for (auto it = kv_.begin(); it != kv_.end();) {
    if (it->second.expires <= now) {
      bytes_ -= it->first.size() + it->second.value.size();
      it = kv_.erase(it);
    } else {
      ++it;
    }
  }
}

namespace {

absl::Status CheckKey(const std::string& key, size_t max_bytes) {
  if (!key.empty() && key.size() <= max_bytes) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("store key is empty or over ", max_bytes, " bytes"));
}

}  // namespace

absl::Status RendezvousStore::Set(const std::string& key, std::string value) {
  REPVAR_RETURN_IF_ERROR(CheckKey(key, kMaxKeyBytes));
  if (value.size() > kMaxValueBytes) {
    return absl::InvalidArgumentError(absl::StrCat("store value over ", kMaxValueBytes, " bytes"));
  }
  const absl::Time now = clock_->Now();
  RankedLock lock(&mu_);
  auto fits = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto old = kv_.find(key);
    const size_t freed = old == kv_.end() ? 0 : key.size() + old->second.value.size();
    return (kv_.size() < kMaxKeys || old != kv_.end()) &&
           bytes_ - freed + key.size() + value.size() <= kMaxTotalBytes;
  };
  if (!fits()) DropExpired(now);
  if (!fits()) {
    return absl::ResourceExhaustedError(absl::StrCat("rendezvous store is full (", kv_.size(),
                                                     " keys, ", bytes_,
                                                     " bytes that have not expired)"));
  }
  auto old = kv_.find(key);
  const size_t freed_now = old == kv_.end() ? 0 : key.size() + old->second.value.size();
  bytes_ = bytes_ - freed_now + key.size() + value.size();
  kv_[key] = Entry{std::move(value), now + ttl_};
  return absl::OkStatus();
}

absl::StatusOr<std::string> RendezvousStore::Get(const std::string& key,
                                                 absl::Time deadline) const {
  REPVAR_RETURN_IF_ERROR(CheckKey(key, kMaxKeyBytes));
  RankedLock lock(&mu_);
  auto present = [this, &key]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = kv_.find(key);
    return it != kv_.end() && it->second.expires > clock_->Now();
  };
  if (!mu_.native()->AwaitWithDeadline(absl::Condition(&present), deadline)) {
    return absl::DeadlineExceededError(absl::StrCat("store key \"", key, "\" never arrived"));
  }
  return kv_.at(key).value;
}

void RendezvousStore::DeletePrefix(const std::string& prefix) {
  RankedLock lock(&mu_);
  for (auto it = kv_.lower_bound(prefix); it != kv_.end() && it->first.starts_with(prefix);) {
    bytes_ -= it->first.size() + it->second.value.size();
    it = kv_.erase(it);
  }
}

size_t RendezvousStore::size() const {
  RankedLock lock(&mu_);
  return kv_.size();
}

}  // namespace repvar::server
