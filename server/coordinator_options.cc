// SPDX-License-Identifier: Apache-2.0
#include "server/coordinator_options.h"

#include <algorithm>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/status_util.h"
#include "common/model/names.h"

namespace repvar::server {

absl::StatusOr<std::map<std::string, int32_t>> ParseExpectedTasks(absl::string_view text) {
  std::map<std::string, int32_t> out;
  if (text.empty()) return out;
  for (absl::string_view part : absl::StrSplit(text, absl::ByChar(','))) {
    std::vector<std::string> kv = absl::StrSplit(part, absl::ByChar(':'));
    int32_t n = 0;
    if (kv.size() != 2 || !IsValidJobName(kv[0]) || !absl::SimpleAtoi(kv[1], &n) || n < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--expected_tasks: bad entry \"", part, "\"; want job:count"));
    }
    out[kv[0]] = n;
  }
  return out;
}

absl::Status ValidateOptions(const CoordinatorDaemonOptions& o) {
  REPVAR_RETURN_IF_ERROR(ParseExpectedTasks(o.expected_tasks).status());
  if (o.heartbeat_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--heartbeat_timeout must be positive");
  }
  if (o.read_lease < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--read_lease must not be negative");
  }
  if (o.idempotency_window <= absl::ZeroDuration() || o.idempotency_capacity < 1) {
    return absl::InvalidArgumentError(
        "--idempotency_window and --idempotency_capacity must be positive");
  }
  if (o.max_variable_bytes < 1 || o.max_inflight_bytes < 0 ||
      o.max_inflight_bytes_per_connection < 0 || o.min_free_bytes < 0) {
    return absl::InvalidArgumentError(
        "--max_variable_bytes must be positive; --max_inflight_bytes, "
        "--max_inflight_bytes_per_connection and --min_free_bytes not negative");
  }
  if (o.data_dir.empty() == !o.ephemeral) {
    return absl::InvalidArgumentError(
        "give exactly one of --data_dir=DIR (state kept on disk) and --ephemeral (state in "
        "memory, lost on restart)");
  }
  if (o.checkpoint_every_steps > 0 &&
      ((o.checkpoint_dir.empty() && o.data_dir.empty()) || o.checkpoint_keep < 1)) {
    return absl::InvalidArgumentError(
        "--checkpoint_every_steps needs --checkpoint_dir (or --data_dir) and "
        "--checkpoint_keep >= 1");
  }
  if (o.max_rpc_threads < 1) return absl::InvalidArgumentError("--max_rpc_threads must be >= 1");
  return absl::OkStatus();
}

CoordinatorOptions CoreOptionsOf(const CoordinatorDaemonOptions& o) {
  CoordinatorOptions c;
  c.membership.heartbeat_timeout = o.heartbeat_timeout;
  c.membership.read_lease = o.read_lease;
  c.membership.expected_tasks =
      ParseExpectedTasks(o.expected_tasks).value_or(std::map<std::string, int32_t>{});
  c.max_variable_bytes = static_cast<uint64_t>(o.max_variable_bytes);
  c.idempotency_window = o.idempotency_window;
  c.idempotency_capacity = static_cast<size_t>(o.idempotency_capacity);
  if (o.max_inflight_bytes > 0) c.max_inflight_bytes = static_cast<uint64_t>(o.max_inflight_bytes);
  c.replication.data_plane = o.data_plane;
  c.replication.data_plane_min_bytes = static_cast<uint64_t>(o.data_plane_min_bytes);
  return c;
}

RocksStateLogOptions StoreOptionsOf(const CoordinatorDaemonOptions& o) {
  RocksStateLogOptions s;
  s.dir = o.data_dir;
  s.min_free_bytes = static_cast<uint64_t>(o.min_free_bytes);
  s.checkpoint_every = static_cast<uint64_t>(std::max<int64_t>(1, o.checkpoint_every));
  s.checkpoint_blob_bytes = static_cast<uint64_t>(std::max<int64_t>(1, o.checkpoint_blob_bytes));
  s.blobs.recycle_bytes = static_cast<uint64_t>(std::max<int64_t>(0, o.blob_recycle_bytes));
  s.sync = !o.unsafe_no_fsync;
  return s;
}

std::optional<CheckpointerOptions> CheckpointerOptionsOf(const CoordinatorDaemonOptions& o) {
  if (o.checkpoint_every_steps <= 0) return std::nullopt;
  std::string dir = o.checkpoint_dir;
  if (dir.empty()) dir = o.data_dir + "/checkpoints";
  return CheckpointerOptions{dir, o.checkpoint_every_steps, o.checkpoint_keep};
}

}  // namespace repvar::server
