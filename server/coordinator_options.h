// SPDX-License-Identifier: Apache-2.0
// repvar-coordinator's settings: one field per flag of its own (the flags'
// defaults are these fields'), checked before anything starts, and the
// options of each part coordinator_main.cc wires from them.
#ifndef REPVAR_SERVER_COORDINATOR_OPTIONS_H_
#define REPVAR_SERVER_COORDINATOR_OPTIONS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/core/coordinator.h"
#include "server/store/checkpointer.h"
#include "server/store/rocks_state_log.h"

namespace repvar::server {

struct CoordinatorDaemonOptions {
  // Serving.
  std::string listen_address = "127.0.0.1:0";
  std::string port_file;
  std::string worker_token_file;
  int32_t max_rpc_threads = 512;
  // Membership.
  absl::Duration heartbeat_timeout = absl::Seconds(10);
  absl::Duration read_lease = absl::Seconds(3);
  std::string expected_tasks;  // job:count[,job:count]
  // Variables and writes.
  int64_t max_variable_bytes = int64_t{64} << 30;
  bool data_plane = true;
  int64_t data_plane_min_bytes = 1 << 20;
  absl::Duration idempotency_window = absl::Hours(1);
  int64_t idempotency_capacity = 1000000;
  int64_t max_inflight_bytes = 0;                 // 0: half the machine's memory
  int64_t max_inflight_bytes_per_connection = 0;  // 0: half of max_inflight_bytes
  // The state: exactly one of data_dir and ephemeral.
  std::string data_dir;
  bool ephemeral = false;
  int64_t min_free_bytes = int64_t{64} << 20;
  int64_t checkpoint_every = 4096;
  int64_t checkpoint_blob_bytes = int64_t{256} << 20;
  int64_t blob_recycle_bytes = int64_t{1} << 30;
  bool unsafe_no_fsync = false;
  // Periodic checkpoints (0 steps: none).
  int64_t checkpoint_every_steps = 0;
  int32_t checkpoint_keep = 3;
  std::string checkpoint_dir;  // default: <data_dir>/checkpoints
};

// Every check on the settings before anything starts. Errors:
// INVALID_ARGUMENT naming the flag and what it needs.
absl::Status ValidateOptions(const CoordinatorDaemonOptions& options);

// "job:count[,job:count]" as a map. Errors: INVALID_ARGUMENT.
absl::StatusOr<std::map<std::string, int32_t>> ParseExpectedTasks(absl::string_view text);

// The options of the parts, from validated settings.
CoordinatorOptions CoreOptionsOf(const CoordinatorDaemonOptions& options);
// With data_dir set.
RocksStateLogOptions StoreOptionsOf(const CoordinatorDaemonOptions& options);
// nullopt when no periodic checkpoint is asked for.
std::optional<CheckpointerOptions> CheckpointerOptionsOf(const CoordinatorDaemonOptions& options);

}  // namespace repvar::server

#endif  // REPVAR_SERVER_COORDINATOR_OPTIONS_H_
