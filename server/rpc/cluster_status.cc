// SPDX-License-Identifier: Apache-2.0
#include "server/rpc/cluster_status.h"

#include "common/rpc/to_proto.h"
#include "server/core/core_metrics.h"

namespace repvar::server {

void ClusterStatusToProto(Coordinator* core, const ScalarBoard* scalars, size_t max_variables,
                          v1::ClusterStatus* out) {
  TopologyToProto(core->registry().Snapshot(), out->mutable_topology());
  const std::vector<VariableView> variables = core->ListVariables("");
  out->set_variable_count(static_cast<int64_t>(variables.size()));
  auto& by_state = *out->mutable_replicas_by_state();
  for (const VariableView& v : variables) {
    for (const ReplicaView& r : v.replicas) ++by_state[ReplicaStateName(r.state)];
    if (max_variables == 0 || static_cast<size_t>(out->variables_size()) < max_variables) {
      VariableViewToProto(v, out->add_variables());
    }
  }
  StepsStatusToProto(core->GetSteps(), out->mutable_steps());
  out->set_draining(core->draining());
  for (const char* in : {"step", "verification"}) {
    (*out->mutable_divergences_repaired())[in] =
        static_cast<int64_t>(DivergencesRepaired(in).value());
  }
  if (scalars == nullptr) return;
  for (const ScalarSeries& s : scalars->Snapshot()) {
    v1::ScalarSeries* series = out->add_scalars();
    series->set_name(s.name);
    for (const ScalarPoint& p : s.points) {
      series->add_steps(p.step);
      series->add_values(p.value);
      series->add_counts(p.count);
    }
  }
}

}  // namespace repvar::server
