// SPDX-License-Identifier: Apache-2.0
#include "common/model/task.h"

#include "absl/strings/str_cat.h"

namespace repvar {

std::string TaskKey::ToString() const { return absl::StrCat(job, ":", task); }

}  // namespace repvar
