// SPDX-License-Identifier: Apache-2.0
#include "server/core/step_plan.h"

#include <map>

#include "common/tensor/step_math.h"

namespace repvar::server {

std::vector<int32_t> Voters(const StepVariable& v) {
  std::vector<int32_t> voters;
  for (size_t i = 0; i < v.replica_participant.size(); ++i) {
    if (v.replica_participant[i] >= 0) voters.push_back(static_cast<int32_t>(i));
  }
  return voters;
}

int32_t PickSource(Aggregation aggregation, const std::vector<int32_t>& voters,
                   const std::vector<uint64_t>& checksums) {
  int32_t source = voters.front();
  if (aggregation != Aggregation::kNone) return source;
  std::map<uint64_t, int> count;
  for (int32_t i : voters) ++count[checksums[i]];
  int best = 0;
  for (int32_t i : voters) {  // in replica order: ties go to the lowest
    if (count[checksums[i]] > best) {
      best = count[checksums[i]];
      source = i;
    }
  }
  return source;
}

namespace {

// The repair of a NONE or ONLY_FIRST_REPLICA variable: the voters that do
// not hold the source's value get it from there (no targets: none needed).
StepCollective Repair(const StepVariable& v, uint32_t index, const std::vector<int32_t>& voters,
                      const std::vector<uint64_t>& checksums, int32_t source) {
  StepCollective b;
  b.kind = StepCollective::Kind::kBroadcast;
  b.variables.Append(index);
  b.root = v.replica_participant[source];
  b.source_replica = source;
  b.checksum = checksums[source];
  for (int32_t i : voters) {
    if (checksums[i] != b.checksum) b.targets.push_back(i);
  }
  return b;
}

}  // namespace

StepDecision PlanCollectives(const std::vector<ChangedVariable>& changed) {
  StepDecision d;
  std::map<AccumType, IndexRanges> reduce;
  std::vector<StepCollective> repairs;
  d.expected.reserve(changed.size());
  for (const ChangedVariable& c : changed) {
    const StepVariable& v = *c.variable;
    d.changed.Append(c.index);
    if (v.aggregation == Aggregation::kSum || v.aggregation == Aggregation::kMean) {
      reduce[AccumTypeFor(v.spec.dtype)].Append(c.index);
      d.expected.push_back(0);
      continue;
    }
    if (c.agreed) {  // every replica holds it: nothing to repair
      d.expected.push_back(*c.agreed);
      continue;
    }
    const std::vector<int32_t> voters = Voters(v);
    StepCollective b =
        Repair(v, c.index, voters, c.checksums, PickSource(v.aggregation, voters, c.checksums));
    d.expected.push_back(b.checksum);
    if (b.targets.empty()) continue;
    if (v.aggregation == Aggregation::kNone) {
      d.divergences.push_back(Divergence{v.id, v.name, c.checksums, b.checksum, b.targets});
    }
    repairs.push_back(std::move(b));
  }
  for (auto& [type, indices] : reduce) {
    StepCollective c;
    c.kind = StepCollective::Kind::kAllreduce;
    c.variables = std::move(indices);
    d.collectives.push_back(std::move(c));
  }
  for (StepCollective& b : repairs) d.collectives.push_back(std::move(b));
  return d;
}

}  // namespace repvar::server
