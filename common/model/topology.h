// SPDX-License-Identifier: Apache-2.0
// Who is in the cluster, as the coordinator describes it (docs/contract.md T1-T5).
#ifndef REPVAR_COMMON_MODEL_TOPOLOGY_H_
#define REPVAR_COMMON_MODEL_TOPOLOGY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/model/device_name.h"
#include "common/model/task.h"

namespace repvar {

// What a worker says when it joins (T1).
struct WorkerRegistration {
  std::string job;
  int32_t task = 0;
  std::string address;
  uint64_t incarnation = 0;
  std::vector<std::string> devices;  // full device names, unparsed
};

struct LiveTask {
  TaskKey key;
  std::string address;
  uint64_t incarnation = 0;
  std::vector<DeviceName> devices;  // sorted
  absl::Time last_heartbeat;
};

struct Accelerator {
  int32_t ordinal = 0;
  DeviceName device;
  TaskKey task;
};

// Where input is enqueued and output dequeued: the task owning ordinal 0 (T3).
struct InfeedTask {
  TaskKey task;
  std::string address;
  std::string cpu_device;
};

struct TopologySnapshot {
  int64_t version = 0;
  std::vector<LiveTask> tasks;             // sorted by (job, task)
  std::vector<Accelerator> accelerators;   // in ordinal order (T2)
  std::optional<InfeedTask> infeed_host;   // the task owning ordinal 0 (T3)
  std::vector<std::string> missing_tasks;  // expected but not live, "job:task"
};

}  // namespace repvar

#endif  // REPVAR_COMMON_MODEL_TOPOLOGY_H_
