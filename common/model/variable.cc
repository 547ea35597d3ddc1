// SPDX-License-Identifier: Apache-2.0
#include "common/model/variable.h"

#include "absl/strings/str_cat.h"
#include "common/base/status_util.h"
#include "common/model/names.h"

namespace repvar {

absl::Status ValidateVariableDef(const VariableDef& def, uint64_t max_bytes) {
  REPVAR_RETURN_IF_ERROR(ValidateVariableName(def.name));
  auto bytes = def.tensor.ByteSize();
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("variable ", def.name, ": ", bytes.status().message()));
  }
  if (static_cast<uint64_t>(*bytes) > max_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("variable ", def.name, " needs ", *bytes, " bytes; the limit is ", max_bytes));
  }
  if (def.replica_count < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("variable ", def.name, ": replica_count must be >= 1"));
  }
  if (def.aggregation == Aggregation::kMean && !IsFloating(def.tensor.dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("variable ", def.name, ": MEAN aggregation needs a floating dtype; ",
                     DTypeName(def.tensor.dtype), " would truncate (use SUM)"));
  }
  for (const std::string& c : def.collections) {
    if (c.empty() || c.size() > 256) {
      return absl::InvalidArgumentError(
          absl::StrCat("variable ", def.name, ": collection names must be 1..256 bytes"));
    }
  }
  return absl::OkStatus();
}

const std::vector<Placement>& Placements::Empty() {
  static const std::vector<Placement>* const empty = new std::vector<Placement>();
  return *empty;
}

std::string ReplicaName(const std::string& variable, int32_t index) {
  return absl::StrCat(variable, "/", index);
}

}  // namespace repvar
