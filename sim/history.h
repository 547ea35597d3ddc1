// SPDX-License-Identifier: Apache-2.0
// What the clients saw, per variable, for the linearizability check: each
// operation with its call time, and its answer with its return time when
// it has one. An operation refused for certain (a status that says nothing
// changed) leaves the history; one whose outcome is unknown (no answer, a
// lost connection) stays without a return, free to have happened or not.
#ifndef REPVAR_SIM_HISTORY_H_
#define REPVAR_SIM_HISTORY_H_

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
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

// The step variables' reads (C4, C8). Steps are their only writers, and the
// trainers of a committed step hear each changed value's version and
// checksum, so a read is checked against those commits directly: the value
// it returned is the one committed at its version, and no newer version was
// acknowledged to a trainer before the read was called (versions of a
// variable only grow, S1). A commit no trainer heard is unknown here: a
// read of its version is not checked against a checksum.
class StepReads {
 public:
  // Version `version` of `variable` was committed as `checksum`, first
  // acknowledged at `acknowledged` (microseconds; 0: before the workload).
  void Committed(const std::string& variable, int64_t version, uint64_t checksum,
                 int64_t acknowledged) {
    auto [it, fresh] =
        variables_[variable].commits.try_emplace(version, Commit{checksum, acknowledged});
    if (!fresh) {
      if (it->second.checksum != checksum) conflicts_.push_back(variable);
      it->second.acknowledged = std::min(it->second.acknowledged, acknowledged);
    }
  }
  void Read(const std::string& variable, int64_t call, int64_t version, uint64_t checksum,
            bool local) {
    variables_[variable].reads.push_back({call, version, checksum, local});
  }

  // OK, or the first read no commit explains (`local`: it was served from
  // a worker's read table).
  absl::Status Check(bool& local) const {
    local = false;
    if (!conflicts_.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "variable ", conflicts_.front(), ": one version committed with two checksums"));
    }
    for (const auto& [name, v] : variables_) {
      for (const ReadOp& r : v.reads) {
        const char* how = r.local ? "read locally" : "read";
        local = r.local;
        auto at = v.commits.find(r.version);
        if (at != v.commits.end() && at->second.checksum != r.checksum) {
          return absl::FailedPreconditionError(
              absl::StrCat("variable ", name, ": ", how, " v", r.version, " #", r.checksum % 10000,
                           ", committed as #", at->second.checksum % 10000));
        }
        for (auto it = v.commits.upper_bound(r.version); it != v.commits.end(); ++it) {
          if (it->second.acknowledged < r.call) {
            return absl::FailedPreconditionError(absl::StrCat(
                "variable ", name, ": ", how, " v", r.version, " at ", r.call, " us, but v",
                it->first, " was acknowledged at ", it->second.acknowledged, " us"));
          }
        }
      }
    }
    return absl::OkStatus();
  }

 private:
  struct Commit {
    uint64_t checksum = 0;
    int64_t acknowledged = 0;
  };
  struct ReadOp {
    int64_t call = 0;
    int64_t version = 0;
    uint64_t checksum = 0;
    bool local = false;
  };
  struct Variable {
    std::map<int64_t, Commit> commits;  // by version
    std::vector<ReadOp> reads;
  };
  std::map<std::string, Variable> variables_;
  std::vector<std::string> conflicts_;
};

}  // namespace repvar::sim

#endif  // REPVAR_SIM_HISTORY_H_
