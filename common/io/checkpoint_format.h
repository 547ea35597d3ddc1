// SPDX-License-Identifier: Apache-2.0
// What a repvar checkpoint says about its variables, beside their bytes: the
// safetensors "__metadata__" (strings only, as the format requires) that
// Client::SaveCheckpoint and the coordinator's periodic checkpoints write and
// Client::RestoreCheckpoint reads.
//
//   "repvar.format"               "1"
//   "repvar.last_committed_step"  "120"
//   "repvar.variables"            JSON: {"<name>": {"version": 7,
//                                  "checksum": "<XXH3-64, hex>", "aggregation":
//                                  "MEAN", "replica_count": 8, "trainable": true,
//                                  "allow_nonfinite": false, "collections": [...]}}
//   "repvar.uninitialized"        JSON list of variables not saved (no value)
#ifndef REPVAR_COMMON_IO_CHECKPOINT_FORMAT_H_
#define REPVAR_COMMON_IO_CHECKPOINT_FORMAT_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "repvar/types.h"

namespace repvar::io {

struct CheckpointVariable {
  std::string name;
  int64_t version = 0;
  std::optional<uint64_t> checksum;  // of the saved bytes
  Aggregation aggregation = Aggregation::kNone;
  int32_t replica_count = 1;
  bool trainable = true;
  bool allow_nonfinite = false;
  std::vector<std::string> collections;  // the extra ones given at creation
};

std::map<std::string, std::string> CheckpointMetadata(
    int64_t last_committed_step, const std::vector<CheckpointVariable>& variables,
    const std::vector<std::string>& uninitialized);

// The variables a checkpoint describes, by name; empty for a safetensors
// file repvar did not write. Errors: DATA_LOSS naming what does not parse.
absl::StatusOr<std::map<std::string, CheckpointVariable>> CheckpointVariables(
    const std::map<std::string, std::string>& metadata);

}  // namespace repvar::io

#endif  // REPVAR_COMMON_IO_CHECKPOINT_FORMAT_H_
