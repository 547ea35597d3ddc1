// SPDX-License-Identifier: Apache-2.0
#include "common/model/step.h"

#include <xxhash.h>

#include <algorithm>
#include <memory>
#include <tuple>

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
    bytes(v.replica_participant.view().data(), v.replica_participant.size() * sizeof(int32_t));
  }
  uint64_t id = XXH3_64bits_digest(h.get());
  return id == 0 ? 1 : id;
}

uint64_t DigestTerm(uint64_t variable_id, uint64_t checksum) {
  const uint64_t pair[2] = {variable_id, checksum};
  return XXH3_64bits(pair, sizeof(pair));
}

int32_t ReporterOf(const StepVariable& var, uint32_t index) {
  const std::vector<int32_t>& p = var.replica_participant.view();
  if (p.empty()) return -1;
  if (const int32_t at = p[index % p.size()]; at >= 0) return at;
  for (int32_t x : p) {
    if (x >= 0) return x;
  }
  return -1;
}

namespace {

bool Reduced(const StepVariable& v) {
  return v.aggregation == Aggregation::kSum || v.aggregation == Aggregation::kMean;
}

// The index of variable `id` in `variables` (sorted by id); size() if absent.
uint32_t IndexOfId(const SharedVector<StepVariable>& variables, uint64_t id) {
  auto at = std::lower_bound(variables.begin(), variables.end(), id,
                             [](const StepVariable& v, uint64_t want) { return v.id < want; });
  if (at == variables.end() || at->id != id) return static_cast<uint32_t>(variables.size());
  return static_cast<uint32_t>(at - variables.begin());
}

}  // namespace

WorkerReport SummarizeReport(const SharedVector<StepVariable>& variables, int32_t me,
                             std::vector<ReplicaReport> changed, bool detailed) {
  std::sort(changed.begin(), changed.end(), [](const ReplicaReport& a, const ReplicaReport& b) {
    return std::tie(a.variable_id, a.replica) < std::tie(b.variable_id, b.replica);
  });
  WorkerReport report;
  report.detailed = detailed;
  for (size_t at = 0; at < changed.size();) {
    size_t end = at;
    while (end < changed.size() && changed[end].variable_id == changed[at].variable_id) ++end;
    const uint64_t id = changed[at].variable_id;
    const uint32_t index = IndexOfId(variables, id);
    if (index == variables.size()) {  // not in the step: the barrier refuses it
      report.replicas.insert(report.replicas.end(), changed.begin() + at, changed.begin() + end);
      at = end;
      continue;
    }
    const StepVariable& var = variables[index];
    if (Reduced(var)) {
      report.changed.Append(index);
      at = end;
      continue;
    }
    const uint64_t checksum = changed[at].checksum;
    const size_t local = static_cast<size_t>(
        std::count(var.replica_participant.begin(), var.replica_participant.end(), me));
    const bool uniform =
        end - at == local &&
        std::all_of(changed.begin() + at, changed.begin() + end, [&](const ReplicaReport& r) {
          return r.checksum == checksum && (r.first_nonfinite < 0 || var.allow_nonfinite);
        });
    if (uniform) {
      report.changed.Append(index);
      report.digest += DigestTerm(id, checksum);
      if (ReporterOf(var, index) == me) report.shard.push_back({id, checksum});
    }
    if (!uniform || detailed) {
      report.replicas.insert(report.replicas.end(), changed.begin() + at, changed.begin() + end);
    }
    at = end;
  }
  return report;
}

WorkerFinish SummarizeFinish(const SharedVector<StepVariable>& variables, int32_t me,
                             std::vector<PreparedVariable> values) {
  std::sort(values.begin(), values.end(), [](const PreparedVariable& a, const PreparedVariable& b) {
    return a.variable_id < b.variable_id;
  });
  WorkerFinish finish;
  for (const PreparedVariable& pv : values) {
    const uint32_t index = IndexOfId(variables, pv.variable_id);
    if (index == variables.size()) continue;
    const StepVariable& var = variables[index];
    finish.held.Append(index);
    finish.digest += DigestTerm(pv.variable_id, pv.checksum);
    if (ReporterOf(var, index) == me) finish.shard.push_back({pv.variable_id, pv.checksum});
    if (pv.first_nonfinite >= 0 && !var.allow_nonfinite) finish.nonfinite.push_back(pv);
  }
  return finish;
}

}  // namespace repvar
