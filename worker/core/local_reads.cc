// SPDX-License-Identifier: Apache-2.0
#include "worker/core/local_reads.h"

#include <algorithm>

namespace repvar::worker {

LocalReads::LocalReads(std::span<std::byte> region, size_t slots, const ReplicaStore* store,
                       std::function<int64_t()> monotonic_ns)
    : store_(store), monotonic_ns_(std::move(monotonic_ns)), table_(region, slots) {}

void LocalReads::Written(const std::vector<ReplicaWrite>& items) {
  MutexLock lock(&mu_);
  for (const ReplicaWrite& w : items) Unconfirmed(w.variable_id);
}

void LocalReads::Dropped(uint64_t variable_id) {
  MutexLock lock(&mu_);
  table_.Invalidate(variable_id);
  to_confirm_.erase(variable_id);
}

void LocalReads::Suspend() {
  MutexLock lock(&mu_);
  table_.Suspend();
}

void LocalReads::Resume(const std::vector<Committed>& changed,
                        const std::vector<uint64_t>& unsure) {
  MutexLock lock(&mu_);
  for (const Committed& c : changed) {
    if (PublishHeld(c.variable_id, c.version, c.checksum)) {
      to_confirm_.erase(c.variable_id);
    } else {
      Unconfirmed(c.variable_id);
    }
  }
  for (uint64_t id : unsure) Unconfirmed(id);
  table_.Resume();
}

void LocalReads::EndStep(const std::function<std::vector<uint64_t>()>& held) {
  MutexLock lock(&mu_);
  if (!table_.suspended()) return;
  for (uint64_t id : held()) Unconfirmed(id);
  table_.Resume();
}

void LocalReads::Unconfirmed(uint64_t id) {
  table_.Invalidate(id);
  to_confirm_.insert(id);
}

bool LocalReads::PublishHeld(uint64_t id, int64_t version, std::optional<uint64_t> checksum) {
  absl::StatusOr<StoredReplica> held = store_->First(id);
  if (!held.ok() || held->version != version || (checksum && held->checksum != *checksum) ||
      !held->value) {
    return false;
  }
  const Tensor& t = *held->value;
  return table_.Publish(id, held->name, version, t.spec, held->checksum, t.bytes.span());
}

LocalReads::Round LocalReads::StartRound(size_t max) {
  Round round;
  round.sent_ns = monotonic_ns_();
  MutexLock lock(&mu_);
  // From where the last round stopped, wrapping: values the coordinator
  // keeps refusing do not starve the others.
  auto it = to_confirm_.lower_bound(cursor_);
  for (size_t n = 0; n < to_confirm_.size() && round.held.size() < max; ++n) {
    if (it == to_confirm_.end()) it = to_confirm_.begin();
    absl::StatusOr<StoredReplica> held = store_->First(*it);
    if (held.ok()) {
      round.held.push_back(HeldValue{*it, held->replica, held->version, held->checksum});
    }
    ++it;
  }
  cursor_ = it == to_confirm_.end() ? 0 : *it;
  return round;
}

void LocalReads::Granted(const Round& round, absl::Duration lease,
                         const std::vector<bool>& confirmed) {
  MutexLock lock(&mu_);
  for (size_t i = 0; i < round.held.size() && i < confirmed.size(); ++i) {
    const HeldValue& h = round.held[i];
    // Still to confirm and still that value: a write applied since is not
    // what the coordinator confirmed.
    if (!confirmed[i] || !to_confirm_.contains(h.variable_id)) continue;
    if (PublishHeld(h.variable_id, h.version, h.checksum)) to_confirm_.erase(h.variable_id);
  }
  // No lease ends reads now; a lease never shortens an earlier one.
  const int64_t until = round.sent_ns + absl::ToInt64Nanoseconds(lease);
  table_.SetLease(lease > absl::ZeroDuration() ? std::max(until, table_.lease()) : 0);
}

void LocalReads::Lost() {
  MutexLock lock(&mu_);
  table_.Clear();
  for (const StoredReplica& r : store_->List()) to_confirm_.insert(r.variable_id);
}

size_t LocalReads::readable() const {
  MutexLock lock(&mu_);
  return table_.readable();
}

size_t LocalReads::to_confirm() const {
  MutexLock lock(&mu_);
  return to_confirm_.size();
}

}  // namespace repvar::worker
