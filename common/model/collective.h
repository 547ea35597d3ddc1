// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_COMMON_MODEL_COLLECTIVE_H_
#define REPVAR_COMMON_MODEL_COLLECTIVE_H_

#include <cstdint>
#include <string>

#include "absl/time/time.h"

namespace repvar {

// One data-plane collective (a gloo broadcast) as the coordinator orders it
// and a worker runs it: the root has the bytes, every other member of the
// group receives them. Members of a group share one gloo context; the
// coordinator gives each collective of a group a distinct tag, in order.
struct CollectiveSpec {
  std::string group;  // names the member set and its generation
  int32_t rank = 0;
  int32_t size = 0;
  int32_t root = 0;
  uint32_t tag = 0;
  absl::Duration timeout = absl::Seconds(60);
};

}  // namespace repvar

#endif  // REPVAR_COMMON_MODEL_COLLECTIVE_H_
