// SPDX-License-Identifier: Apache-2.0
#include "common/model/step.h"

#include <xxhash.h>

#include <memory>

namespace repvar {

uint64_t LayoutId(const StepInfo& info) {
  // One streaming hash over the layout's fields (strings with their length,
  // so that no two layouts run together).
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> h(XXH3_createState(), &XXH3_freeState);
  XXH3_64bits_reset(h.get());
  auto bytes = [&](const void* p, size_t n) { XXH3_64bits_update(h.get(), p, n); };
  auto str = [&](const std::string& x) {
    uint64_t n = x.size();
    bytes(&n, sizeof(n));
    bytes(x.data(), x.size());
  };
  auto num = [&](uint64_t x) { bytes(&x, sizeof(x)); };
  for (const StepParticipant& p : info.participants) {
    str(p.task.job);
    num(static_cast<uint64_t>(p.task.task));
    num(p.incarnation);
    str(p.address);
  }
  for (const StepVariable& v : info.variables) {
    num(v.id);
    str(v.name);
    num(static_cast<uint64_t>(v.aggregation));
    num(static_cast<uint64_t>(v.spec.dtype));
    num(v.spec.dims.size());
    for (int64_t d : v.spec.dims) num(static_cast<uint64_t>(d));
    num(v.allow_nonfinite ? 1 : 0);
    num(v.replica_participant.size());
    bytes(v.replica_participant.data(), v.replica_participant.size() * sizeof(int32_t));
  }
  uint64_t id = XXH3_64bits_digest(h.get());
  return id == 0 ? 1 : id;
}

}  // namespace repvar
