// SPDX-License-Identifier: Apache-2.0
#include "common/model/device_name.h"

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace repvar {
namespace {

constexpr size_t kMaxDeviceNameBytes = 256;

bool ParseNumber(absl::string_view s, int32_t* out) {
  if (s.empty() || s.size() > 10) return false;
  if (s.size() > 1 && s[0] == '0') return false;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  if (v > INT32_MAX) return false;
  *out = static_cast<int32_t>(v);
  return true;
}

absl::Status Bad(absl::string_view name, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("malformed device name \"", absl::CHexEscape(name), "\": ", why,
                   "; expected /job:<name>/replica:<n>/task:<n>/device:<CPU|GPU|TPU>:<n>"));
}

// Splits "key:value" and checks the key.
bool Field(absl::string_view part, absl::string_view key, absl::string_view* value) {
  if (part.size() <= key.size() || part.substr(0, key.size()) != key || part[key.size()] != ':') {
    return false;
  }
  *value = part.substr(key.size() + 1);
  return true;
}

}  // namespace

bool IsValidJobName(absl::string_view job) {
  if (job.empty() || job.size() > 64) return false;
  if (job[0] < 'a' || job[0] > 'z') return false;
  for (char c : job) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
    if (!ok) return false;
  }
  return true;
}

absl::StatusOr<DeviceName> DeviceName::Parse(absl::string_view name) {
  if (name.size() > kMaxDeviceNameBytes) return Bad(name.substr(0, 64), "longer than 256 bytes");
  if (name.empty() || name[0] != '/') return Bad(name, "must start with '/'");
  std::vector<absl::string_view> parts = absl::StrSplit(name.substr(1), absl::ByChar('/'));
  if (parts.size() != 4) return Bad(name, "must have exactly four components");
  DeviceName d;
  absl::string_view v;
  if (!Field(parts[0], "job", &v) || !IsValidJobName(v)) {
    return Bad(name, "job must match [a-z][a-z0-9_]*");
  }
  d.job = std::string(v);
  if (!Field(parts[1], "replica", &v) || !ParseNumber(v, &d.replica)) {
    return Bad(name, "bad replica number");
  }
  if (!Field(parts[2], "task", &v) || !ParseNumber(v, &d.task)) {
    return Bad(name, "bad task number");
  }
  if (!Field(parts[3], "device", &v)) return Bad(name, "missing device");
  size_t colon = v.rfind(':');
  if (colon == absl::string_view::npos) return Bad(name, "device needs TYPE:ID");
  absl::string_view type = v.substr(0, colon);
  if (type != "CPU" && type != "GPU" && type != "TPU" && type != "TPU_SYSTEM") {
    return Bad(name, "device type must be CPU, GPU, TPU or TPU_SYSTEM");
  }
  d.type = std::string(type);
  if (!ParseNumber(v.substr(colon + 1), &d.id)) return Bad(name, "bad device id");
  return d;
}

std::string DeviceName::ToString() const {
  return absl::StrCat("/job:", job, "/replica:", replica, "/task:", task, "/device:", type, ":",
                      id);
}

std::string DeviceName::HostCpu() const {
  return absl::StrCat("/job:", job, "/replica:", replica, "/task:", task, "/device:CPU:0");
}

}  // namespace repvar
