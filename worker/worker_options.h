// SPDX-License-Identifier: Apache-2.0
// repvar-worker's settings: one field per flag of its own (the flags'
// defaults are these fields'), checked before anything starts, and what
// worker_main.cc derives from them.
#ifndef REPVAR_WORKER_WORKER_OPTIONS_H_
#define REPVAR_WORKER_WORKER_OPTIONS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker/core/step_table.h"

namespace repvar::worker {

struct WorkerDaemonOptions {
  std::string job = "tpu_worker";
  int32_t task = 0;
  std::string listen_address = "127.0.0.1:0";
  std::string advertise_host = "127.0.0.1";
  std::string coordinator_address;  // main falls back to $REPVAR_COORDINATOR_ADDRESS
  std::string devices;              // comma-separated full device names
  int32_t tpu_devices = -1;         // >= 0: this many virtual TPUs (plus CPU:0) instead
  std::string token_file;
  std::string port_file;
  int64_t max_inflight_bytes = 0;                 // 0: half the machine's memory
  int64_t max_inflight_bytes_per_connection = 0;  // 0: half of max_inflight_bytes
  // Names and values of the local read table (0: none, every read goes to
  // the coordinator).
  int64_t local_read_bytes = int64_t{64} << 20;
};

// Every check on the settings before anything starts. Errors:
// INVALID_ARGUMENT naming the flag and what it needs.
absl::Status ValidateOptions(const WorkerDaemonOptions& options);

// This host's full device names, from --devices or --tpu_devices.
std::vector<std::string> DeviceNamesOf(const WorkerDaemonOptions& options);

// Who this process is, with its accelerators as "TYPE:ID".
WorkerIdentity IdentityOf(const WorkerDaemonOptions& options, uint64_t incarnation);

}  // namespace repvar::worker

#endif  // REPVAR_WORKER_WORKER_OPTIONS_H_
