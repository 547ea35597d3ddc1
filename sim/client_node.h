// SPDX-License-Identifier: Apache-2.0
// A client host in the simulation: a trainer's cross-replica operations as
// the client library makes them (every mutating call with a request id,
// retried with the same id while the answer is UNAVAILABLE or
// DEADLINE_EXCEEDED), each recorded in the history with what it saw.
#ifndef REPVAR_SIM_CLIENT_NODE_H_
#define REPVAR_SIM_CLIENT_NODE_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/core/coordinator.h"
#include "sim/network.h"

namespace repvar::sim {

class World;

class ClientNode {
 public:
  ClientNode(World* world, NodeId node, int index) : world_(world), node_(node), index_(index) {}

  // SETUP, by one client: waits for every worker, creates `variables`
  // float32[2] variables "v<i>" and initializes them, and records their
  // state as each history's start; and `step_variables` more, "s<i>" of
  // each aggregation in turn, for the trainers' steps alone. `done` once
  // it succeeded.
  void StartSetup(int variables, int step_variables, int accelerators);
  // STORM: `ops` random operations on the variables.
  void StartWorkload(int ops);
  bool done() const { return done_; }
  const std::vector<std::string>& variables() const { return variables_; }

 private:
  void Setup(int variables, int step_variables, int accelerators);
  // A setup read: retried until it is answered.
  ReadResult ReadUntilAnswered(const std::string& name);
  void Workload(int ops);
  // One operation of the workload, recorded in the history.
  void Write(const std::string& name, AssignOp op, std::vector<float> value);
  void Read(const std::string& name);
  // Creates a variable of its own (a random replica count) and initializes
  // it to `constant`: a write from version 0 in the history. Used by later
  // operations once initialized.
  void Create(float constant);
  // A read from the host's worker's local read table (C8); false when it
  // does not serve it (the caller asks the coordinator).
  bool ReadLocally(const std::string& name);
  // A read's answer, for the check of its kind: World::history, or
  // World::step_reads for a step variable ("s...").
  void Record(const std::string& name, int64_t call, int64_t version, uint64_t checksum,
              bool local);
  // One call to the coordinator, handled by `serve` on a thread of its
  // process (UNAVAILABLE when it does not serve).
  template <typename T>
  absl::StatusOr<T> Call(const char* name,
                         std::function<void(server::Coordinator*, Network::Answer<T>)> serve);
  // Call, retried while the outcome is unknown (UNAVAILABLE, DEADLINE_EXCEEDED).
  template <typename T>
  absl::StatusOr<T> Retried(const char* name,
                            std::function<void(server::Coordinator*, Network::Answer<T>)> serve,
                            int attempts);
  std::string NewRequestId();
  int64_t Micros() const;

  World* const world_;
  const NodeId node_;
  const int index_;
  ProcessId process_ = -1;
  std::vector<std::string> variables_;
  std::vector<std::string> step_variables_;
  std::vector<std::string> created_;
  int creates_ = 0;
  uint64_t requests_ = 0;
  bool done_ = false;
};

}  // namespace repvar::sim

#endif  // REPVAR_SIM_CLIENT_NODE_H_
