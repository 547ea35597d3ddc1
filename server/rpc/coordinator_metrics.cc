// SPDX-License-Identifier: Apache-2.0
#include "server/rpc/coordinator_metrics.h"

#include <map>

#include "absl/time/clock.h"
#include "common/base/metrics.h"
#include "common/rpc/metrics_server.h"

namespace repvar::server {
namespace {

using Series = std::vector<std::pair<MetricLabels, double>>;
constexpr const char* kGauges[] = {"repvar_workers",
                                   "repvar_variables",
                                   "repvar_replicas",
                                   "repvar_replica_lag_versions",
                                   "repvar_last_committed_step",
                                   "repvar_open_step_age_seconds",
                                   "repvar_open_step_stragglers",
                                   "repvar_inflight_bytes"};

}  // namespace

void RegisterCoordinatorGauges(Coordinator* core) {
  Metrics& m = Metrics::Global();
  m.SetGauge("repvar_workers", "workers by state (live: registered and heartbeating)", [core] {
    const TopologySnapshot topo = core->registry().Snapshot();
    return Series{{{{"state", "live"}}, static_cast<double>(topo.tasks.size())},
                  {{{"state", "missing"}}, static_cast<double>(topo.missing_tasks.size())}};
  });
  m.SetGauge("repvar_variables", "variables, by whether a replica needs a resync", [core] {
    double resync = 0, in_sync = 0;
    for (const VariableView& v : core->ListVariables("")) (v.needs_resync ? resync : in_sync) += 1;
    return Series{{{{"needs_resync", "false"}}, in_sync}, {{{"needs_resync", "true"}}, resync}};
  });
  m.SetGauge("repvar_replicas", "replicas by state", [core] {
    std::map<ReplicaState, double> by_state;
    for (ReplicaState s : {ReplicaState::kUninitialized, ReplicaState::kUpToDate,
                           ReplicaState::kStale, ReplicaState::kUnavailable}) {
      by_state[s] = 0;
    }
    for (const VariableView& v : core->ListVariables("")) {
      for (const ReplicaView& r : v.replicas) ++by_state[r.state];
    }
    Series out;
    for (const auto& [state, n] : by_state)
      out.push_back({{{"state", ReplicaStateName(state)}}, n});
    return out;
  });
  m.SetGauge("repvar_replica_lag_versions",
             "replication lag: versions the furthest-behind replica on a live worker lacks, "
             "and how many such replicas are behind (the periodic repair catches them up)",
             [core] {
               double max_lag = 0, behind = 0;
               for (const VariableView& v : core->ListVariables("")) {
                 for (const ReplicaView& r : v.replicas) {
                   if (r.state == ReplicaState::kUnavailable || r.version >= v.version) continue;
                   max_lag = std::max(max_lag, static_cast<double>(v.version - r.version));
                   ++behind;
                 }
               }
               return Series{{{{"of", "max"}}, max_lag}, {{{"of", "replicas_behind"}}, behind}};
             });
  m.SetGauge("repvar_last_committed_step", "the last replicated step committed", [core] {
    return Series{{{}, static_cast<double>(core->LastCommittedStep())}};
  });
  m.SetGauge(
      "repvar_open_step_age_seconds", "how long the open step has been open (0: none)", [core] {
        const StepsStatus steps = core->GetSteps();
        const double age = steps.open ? absl::ToDoubleSeconds(absl::Now() - steps.open->begun) : 0;
        return Series{{{}, age}};
      });
  m.SetGauge("repvar_open_step_stragglers",
             "participants of the open step that have not reported yet", [core] {
               const StepsStatus steps = core->GetSteps();
               double waiting = 0;
               for (const ParticipantProgress& p : steps.progress) waiting += !p.reported;
               return Series{{{}, steps.open ? waiting : 0}};
             });
  SetInflightBytesGauge(core->budget());
}

void UnregisterCoordinatorGauges() {
  for (const char* name : kGauges) Metrics::Global().RemoveGauge(name);
}

}  // namespace repvar::server
