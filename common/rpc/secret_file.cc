// SPDX-License-Identifier: Apache-2.0
#include "common/rpc/secret_file.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace repvar {

absl::StatusOr<std::string> ReadFile(absl::string_view what, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(what, " ", path, ": cannot be read"));
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().empty())
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, " is empty"));
  return text.str();
}

}  // namespace repvar
