// SPDX-License-Identifier: Apache-2.0
#include "worker/worker_options.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/model/device_name.h"
#include "common/model/names.h"

namespace repvar::worker {

absl::Status ValidateOptions(const WorkerDaemonOptions& o) {
  if (o.coordinator_address.empty()) {
    return absl::InvalidArgumentError("need --coordinator_address or REPVAR_COORDINATOR_ADDRESS");
  }
  if (!IsValidJobName(o.job) || o.task < 0) {
    return absl::InvalidArgumentError("--job must match [a-z][a-z0-9_]* and --task be >= 0");
  }
  if (o.tpu_devices >= 0 && !o.devices.empty()) {
    return absl::InvalidArgumentError("give --devices or --tpu_devices, not both");
  }
  for (const std::string& d : DeviceNamesOf(o)) {
    if (absl::Status s = DeviceName::Parse(d).status(); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--devices: ", s.message()));
    }
  }
  if (o.max_inflight_bytes < 0 || o.max_inflight_bytes_per_connection < 0) {
    return absl::InvalidArgumentError(
        "--max_inflight_bytes and --max_inflight_bytes_per_connection must not be negative");
  }
  if (o.local_read_bytes < 0 || o.local_read_bytes > (int64_t{64} << 30)) {
    return absl::InvalidArgumentError("--local_read_bytes must be in [0, 64 GiB]");
  }
  return absl::OkStatus();
}

std::vector<std::string> DeviceNamesOf(const WorkerDaemonOptions& o) {
  std::vector<std::string> devices;
  if (o.tpu_devices >= 0) {
    const std::string task = absl::StrCat("/job:", o.job, "/replica:0/task:", o.task);
    devices.push_back(absl::StrCat(task, "/device:CPU:0"));
    for (int i = 0; i < o.tpu_devices; ++i)
      devices.push_back(absl::StrCat(task, "/device:TPU:", i));
    return devices;
  }
  for (absl::string_view d : absl::StrSplit(o.devices, absl::ByChar(','), absl::SkipEmpty())) {
    devices.emplace_back(d);
  }
  return devices;
}

WorkerIdentity IdentityOf(const WorkerDaemonOptions& o, uint64_t incarnation) {
  WorkerIdentity identity{o.job, o.task, incarnation, {}};
  for (const std::string& d : DeviceNamesOf(o)) {
    auto parsed = DeviceName::Parse(d);
    if (parsed.ok() && parsed->IsAccelerator()) {
      identity.accelerators.push_back(absl::StrCat(parsed->type, ":", parsed->id));
    }
  }
  return identity;
}

}  // namespace repvar::worker
