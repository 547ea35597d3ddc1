// SPDX-License-Identifier: Apache-2.0
// What the clients saw, per variable, for the linearizability check: each
// operation with its call time, and its answer with its return time when
// it has one. An operation refused for certain (a status that says nothing
// changed) leaves the history; one whose outcome is unknown (no answer, a
// lost connection) stays without a return, free to have happened or not.
#ifndef REPVAR_SIM_HISTORY_H_
#define REPVAR_SIM_HISTORY_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "sim/linearizability.h"

namespace repvar::sim {

class History {
 public:
  // The committed state of `variable` when its history begins.
  void SetInitial(const std::string& variable, RegisterState state) {
    variables_[variable].initial = std::move(state);
  }
  // An operation called at `call` (microseconds); returns its handle.
  size_t Begin(const std::string& variable, RegisterOp op) {
    Variable& v = variables_[variable];
    v.ops.push_back(std::move(op));
    v.refused.push_back(false);
    return v.ops.size() - 1;
  }
  void Answered(const std::string& variable, size_t op, int64_t ret, int64_t version,
                uint64_t checksum) {
    RegisterOp& o = variables_[variable].ops[op];
    o.ret = ret;
    o.version = version;
    o.checksum = checksum;
  }
  // Certainly not applied: dropped from the history.
  void Refused(const std::string& variable, size_t op) { variables_[variable].refused[op] = true; }

  // OK, or the first variable whose history no order explains.
  absl::Status Check() const {
    for (const auto& [name, v] : variables_) {
      std::vector<RegisterOp> ops;
      for (size_t i = 0; i < v.ops.size(); ++i) {
        if (!v.refused[i]) ops.push_back(v.ops[i]);
      }
      if (absl::Status s = CheckLinearizable(ops, v.initial); !s.ok()) {
        return absl::Status(s.code(), "variable " + name + ": " + std::string(s.message()));
      }
    }
    return absl::OkStatus();
  }
  size_t operations() const {
    size_t n = 0;
    for (const auto& [name, v] : variables_) n += v.ops.size();
    return n;
  }

 private:
  struct Variable {
    RegisterState initial;
    std::vector<RegisterOp> ops;
    std::vector<bool> refused;  // by op
  };
  std::map<std::string, Variable> variables_;
};

}  // namespace repvar::sim

#endif  // REPVAR_SIM_HISTORY_H_
