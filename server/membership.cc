// SPDX-License-Identifier: Apache-2.0
#include "server/membership.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "spdlog/spdlog.h"

namespace repvar::server {

Membership::Membership(MembershipOptions options, Clock* clock)
    : options_(std::move(options)), clock_(clock) {}

absl::StatusOr<int64_t> Membership::Register(const WorkerRegistration& reg) {
  // Validate everything before touching state.
  if (!IsValidJobName(reg.job)) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid job name \"", reg.job, "\": must match [a-z][a-z0-9_]*"));
  }
  if (reg.task < 0) return absl::InvalidArgumentError("task must be >= 0");
  if (reg.address.empty()) return absl::InvalidArgumentError("worker address is empty");
  if (reg.incarnation == 0) return absl::InvalidArgumentError("incarnation must not be 0");
  TaskKey key{reg.job, reg.task};
  std::vector<DeviceName> devices;
  std::set<DeviceName> seen;
  for (size_t i = 0; i < reg.devices.size(); ++i) {
    auto d = DeviceName::Parse(reg.devices[i]);
    if (!d.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("devices[", i, "]: ", d.status().message()));
    }
    if (d->job != reg.job || d->task != reg.task) {
      return absl::InvalidArgumentError(absl::StrCat("devices[", i, "] ", d->ToString(),
                                                     " does not belong to task ", key.ToString()));
    }
    if (!seen.insert(*d).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("devices[", i, "] ", d->ToString(), " is listed twice"));
    }
    devices.push_back(*std::move(d));
  }
  std::sort(devices.begin(), devices.end());

  absl::MutexLock lock(&mu_);
  auto it = tasks_.find(key);
  if (it != tasks_.end()) {
    LiveTask& t = it->second;
    if (t.incarnation != reg.incarnation) {
      return absl::AbortedError(absl::StrCat(
          "task ", key.ToString(), " is live under incarnation ", t.incarnation, "; incarnation ",
          reg.incarnation, " can register once the old one is declared dead (heartbeat timeout ",
          absl::FormatDuration(options_.heartbeat_timeout), ")"));
    }
    if (t.devices != devices || t.address != reg.address) {
      return absl::InvalidArgumentError(
          absl::StrCat("task ", key.ToString(), " incarnation ", reg.incarnation,
                       " registered before with other devices or address; use a new incarnation"));
    }
    t.last_heartbeat = clock_->Now();
    return version_;
  }
  LiveTask t{key, reg.address, reg.incarnation, std::move(devices), clock_->Now()};
  tasks_.emplace(key, std::move(t));
  ++version_;
  return version_;
}

absl::StatusOr<int64_t> Membership::Heartbeat(const TaskKey& key, uint64_t incarnation) {
  absl::MutexLock lock(&mu_);
  auto it = tasks_.find(key);
  if (it == tasks_.end()) {
    return absl::NotFoundError(absl::StrCat("task ", key.ToString(),
                                            " is not registered (or was declared dead); "
                                            "register again"));
  }
  if (it->second.incarnation != incarnation) {
    return absl::AbortedError(absl::StrCat("task ", key.ToString(), " incarnation ", incarnation,
                                           " is stale; live incarnation is ",
                                           it->second.incarnation));
  }
  it->second.last_heartbeat = clock_->Now();
  return version_;
}

std::vector<LiveTask> Membership::CheckHeartbeats(absl::Time now) {
  std::vector<LiveTask> dead;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = tasks_.begin(); it != tasks_.end();) {
      if (now - it->second.last_heartbeat > options_.heartbeat_timeout) {
        dead.push_back(it->second);
        it = tasks_.erase(it);
      } else {
        ++it;
      }
    }
    if (!dead.empty()) ++version_;
  }
  for (const LiveTask& t : dead) {
    spdlog::warn("worker {} (incarnation {}) missed heartbeats for {}; declared dead",
                 t.key.ToString(), t.incarnation, absl::FormatDuration(now - t.last_heartbeat));
  }
  return dead;
}

std::vector<std::string> Membership::MissingLocked() const {
  std::vector<std::string> missing;
  for (const auto& [job, n] : options_.expected_tasks) {
    for (int32_t i = 0; i < n; ++i) {
      if (!tasks_.contains(TaskKey{job, i})) missing.push_back(TaskKey{job, i}.ToString());
    }
  }
  return missing;
}

TopologySnapshot Membership::SnapshotLocked() const {
  TopologySnapshot s;
  s.version = version_;
  for (const auto& [key, t] : tasks_) {
    s.tasks.push_back(t);
    for (const DeviceName& d : t.devices) {
      if (d.IsAccelerator()) s.accelerators.push_back(Accelerator{0, d, key});
    }
  }
  std::sort(s.accelerators.begin(), s.accelerators.end(),
            [](const Accelerator& a, const Accelerator& b) { return a.device < b.device; });
  for (size_t i = 0; i < s.accelerators.size(); ++i) {
    s.accelerators[i].ordinal = static_cast<int32_t>(i);
  }
  if (!s.accelerators.empty()) {
    const Accelerator& first = s.accelerators.front();
    const LiveTask& owner = tasks_.at(first.task);
    s.infeed_host = InfeedTask{first.task, owner.address, first.device.HostCpu()};
  }
  s.missing_tasks = MissingLocked();
  return s;
}

TopologySnapshot Membership::Snapshot() const {
  absl::MutexLock lock(&mu_);
  return SnapshotLocked();
}

TopologySnapshot Membership::WaitForChange(int64_t after_version, absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  auto changed = [this, after_version]()
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return version_ > after_version; };
  mu_.AwaitWithDeadline(absl::Condition(&changed), deadline);
  return SnapshotLocked();
}

absl::StatusOr<TopologySnapshot> Membership::WaitForExpected(absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  auto formed = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return MissingLocked().empty(); };
  if (!mu_.AwaitWithDeadline(absl::Condition(&formed), deadline)) {
    return absl::DeadlineExceededError(absl::StrCat("cluster did not form in time; missing tasks: ",
                                                    absl::StrJoin(MissingLocked(), ", ")));
  }
  return SnapshotLocked();
}

std::optional<LiveTask> Membership::Find(const TaskKey& key) const {
  absl::MutexLock lock(&mu_);
  auto it = tasks_.find(key);
  if (it == tasks_.end()) return std::nullopt;
  return it->second;
}

}  // namespace repvar::server
