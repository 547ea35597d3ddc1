// SPDX-License-Identifier: Apache-2.0
#include "common/model/names.h"

#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace repvar {

absl::Status ValidateVariableName(absl::string_view name) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid variable name \"", absl::CHexEscape(name.substr(0, 80)), "\": ", why));
  };
  if (name.empty()) return bad("empty");
  if (name.size() > kMaxVariableNameBytes) return bad("longer than 256 bytes");
  for (absl::string_view seg : absl::StrSplit(name, absl::ByChar('/'))) {
    if (seg.empty()) return bad("empty path segment (leading, trailing or double '/')");
    if (seg == "." || seg == "..") return bad("'.' and '..' segments are not allowed");
    for (char c : seg) {
      bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '_' || c == '.' || c == '-';
      if (!ok) return bad("characters must be [A-Za-z0-9_.-] and '/'");
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateRequestId(absl::string_view id) {
  if (id.size() > kMaxRequestIdBytes) {
    return absl::InvalidArgumentError("request_id longer than 64 bytes");
  }
  for (char c : id) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError("request_id must be printable ASCII without spaces");
    }
  }
  return absl::OkStatus();
}

}  // namespace repvar
