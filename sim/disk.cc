// SPDX-License-Identifier: Apache-2.0
#include "sim/disk.h"

#include <algorithm>

namespace repvar::sim {

void Disk::Crash() {
  const uint64_t unsynced = records_.size() - synced_;
  records_.resize(synced_ + random_->Uniform(unsynced + 1));
  synced_ = records_.size();
  MutexLock lock(&mu_);
  syncing_ = false;  // the syncing thread died with its process
}

absl::StatusOr<uint64_t> Disk::Append(server::Record& record) {
  if (faults_.full) return absl::ResourceExhaustedError("state log: no space left on device");
  records_.push_back(record);
  if (on_append_) on_append_(records_.back());
  return records_.size();
}

absl::Status Disk::CheckRoom(uint64_t value_bytes) {
  (void)value_bytes;
  if (faults_.full) return absl::ResourceExhaustedError("state log: no space left on device");
  return absl::OkStatus();
}

absl::Status Disk::Durable(uint64_t position) {
  MutexLock lock(&mu_);
  while (position > synced_) {
    if (syncing_) {
      auto done = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !syncing_; };
      mu_.Await(absl::Condition(&done));
      continue;
    }
    // This sync covers what was appended before it began.
    syncing_ = true;
    const uint64_t target = records_.size();
    mu_.Unlock();
    s_->clock()->SleepFor(random_->Between(faults_.min_sync, faults_.max_sync));
    if (random_->Chance(faults_.sync_error)) on_sync_error_();  // does not return
    mu_.Lock();
    synced_ = std::max<uint64_t>(synced_, std::min<uint64_t>(target, records_.size()));
    syncing_ = false;
  }
  return absl::OkStatus();
}

absl::Status Disk::Recover(server::ClusterState& state) {
  for (const server::Record& r : records_) state.Apply(r);
  return absl::OkStatus();
}

}  // namespace repvar::sim
