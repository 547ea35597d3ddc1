// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_COMMON_MODEL_DEVICE_NAME_H_
#define REPVAR_COMMON_MODEL_DEVICE_NAME_H_

#include <compare>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace repvar {

// A fully specified TensorFlow device name:
//   /job:<[a-z][a-z0-9_]*>/replica:<n>/task:<n>/device:<CPU|GPU|TPU|TPU_SYSTEM>:<n>
// Numbers are decimal, no sign, no leading zeros, at most 2^31-1. The whole
// name is at most 256 bytes. Comparison is numeric per field (task:10 sorts
// after task:9), which is what accelerator ordinals are built on (T2).
struct DeviceName {
  std::string job;
  int32_t replica = 0;
  int32_t task = 0;
  std::string type;  // "CPU", "GPU", "TPU", "TPU_SYSTEM"
  int32_t id = 0;

  // Errors: INVALID_ARGUMENT naming what is wrong.
  static absl::StatusOr<DeviceName> Parse(absl::string_view name);

  bool IsAccelerator() const { return type == "TPU" || type == "GPU"; }
  std::string ToString() const;
  // "/job:J/replica:R/task:T/device:CPU:0" of the same task.
  std::string HostCpu() const;

  friend auto operator<=>(const DeviceName&, const DeviceName&) = default;
};

// Job names as used for workers: [a-z][a-z0-9_]*, at most 64 bytes.
bool IsValidJobName(absl::string_view job);

}  // namespace repvar

#endif  // REPVAR_COMMON_MODEL_DEVICE_NAME_H_
