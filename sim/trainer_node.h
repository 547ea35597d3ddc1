// SPDX-License-Identifier: Apache-2.0
// The trainers in the simulation: replicated steps as a training job makes
// them. One driver thread begins each step at the coordinator (over the
// simulated network, as a trainer's BeginStep); on every participating
// host a trainer thread, in that worker's process (it dies with the host),
// writes the host's replicas of the step variables through the worker's
// StepTable and commits. Values per aggregation: NONE, every replica the
// same value (sometimes one replica another: a divergence; sometimes NaN:
// the step fails); SUM and MEAN, a value per replica; ONLY_FIRST_REPLICA,
// a value per replica.
//
// Checks (docs/simulator.md): the trainers of a step that heard an outcome
// from the coordinator heard the same one (S4), committed steps strictly
// increase (S1), and a committed change names the version after the one
// before it (S4: version + 1). Each committed value, with when a trainer
// first heard it, goes to World::step_reads for the clients' reads.
#ifndef REPVAR_SIM_TRAINER_NODE_H_
#define REPVAR_SIM_TRAINER_NODE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/step.h"
#include "sim/network.h"

namespace repvar::sim {

class World;

class TrainerNode {
 public:
  TrainerNode(World* world, NodeId node) : world_(world), node_(node) {}

  // STORM: `steps` steps (a failed step is begun again under its id).
  void StartWorkload(int steps);
  bool done() const { return done_; }

  // What one host's trainer heard of a step.
  struct Heard {
    bool answered = false;  // Commit returned (else the host died, or no answer in time)
    absl::StatusOr<StepResolution> result = absl::UnavailableError("not run");
    int64_t answered_us = 0;  // when Commit returned
  };

 private:
  void Workload(int steps);
  // One step: true when it committed. Its phases: begin, PlanWrites,
  // RunTrainers (trainer_node.cc), then CheckOutcome.
  bool RunStep(int64_t step);
  // The checks of a step's outcome (see above); true when it committed.
  bool CheckOutcome(int64_t step, const StepInfo& info, const std::vector<Heard>& heard);

  World* const world_;
  const NodeId node_;
  ProcessId process_ = -1;
  bool done_ = false;
  int64_t last_committed_ = 0;
  std::map<std::string, int64_t> versions_;  // the step variables' last committed versions
};

}  // namespace repvar::sim

#endif  // REPVAR_SIM_TRAINER_NODE_H_
