// SPDX-License-Identifier: Apache-2.0
// Logical variables and their replicas (docs/contract.md V1-V6, C1-C7): what a
// variable is, how it is seen, and the requests that change it.
#ifndef REPVAR_COMMON_MODEL_VARIABLE_H_
#define REPVAR_COMMON_MODEL_VARIABLE_H_

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/model/device_name.h"
#include "common/model/initializer.h"
#include "common/model/task.h"
#include "common/tensor/tensor.h"
#include "repvar/types.h"

namespace repvar {

inline constexpr char kGlobalVariables[] = "GLOBAL_VARIABLES";
inline constexpr char kTrainableVariables[] = "TRAINABLE_VARIABLES";

// The identity of a logical variable (V2): everything but the initializer.
struct VariableDef {
  std::string name;
  TensorSpec tensor;
  bool trainable = true;
  std::vector<std::string> collections;  // extra ones, sorted and unique
  int32_t replica_count = 1;
  Aggregation aggregation = Aggregation::kNone;
  bool allow_nonfinite = false;
  friend bool operator==(const VariableDef&, const VariableDef&) = default;
};

// Validates a definition on its own (name, spec, replica count >= 1, MEAN
// only for floating dtypes, collection names). Errors: INVALID_ARGUMENT,
// RESOURCE_EXHAUSTED (above max_bytes).
absl::Status ValidateVariableDef(const VariableDef& def, uint64_t max_bytes);

// Where replica i lives: its device and the task owning it, fixed at create.
struct Placement {
  DeviceName device;
  TaskKey task;
  friend bool operator==(const Placement&, const Placement&) = default;
};

// A variable's placements, replica i on (*this)[i]: fixed at create and
// shared, so the variables created together (a batch of a thousand on the
// same accelerators) hold one copy instead of one each.
class Placements {
 public:
  Placements() = default;
  Placements(std::vector<Placement> p)  // NOLINT: a vector is a placement list
      : p_(std::make_shared<const std::vector<Placement>>(std::move(p))) {}
  Placements(std::initializer_list<Placement> p) : Placements(std::vector<Placement>(p)) {}

  const std::vector<Placement>& list() const { return p_ != nullptr ? *p_ : Empty(); }
  size_t size() const { return list().size(); }
  bool empty() const { return list().empty(); }
  const Placement& operator[](size_t i) const { return list()[i]; }
  std::vector<Placement>::const_iterator begin() const { return list().begin(); }
  std::vector<Placement>::const_iterator end() const { return list().end(); }
  friend bool operator==(const Placements& a, const Placements& b) {
    return a.p_ == b.p_ || a.list() == b.list();
  }

 private:
  static const std::vector<Placement>& Empty();
  std::shared_ptr<const std::vector<Placement>> p_;
};

// "<variable>/<index>".
std::string ReplicaName(const std::string& variable, int32_t index);

struct ReplicaView {
  int32_t index = 0;
  std::string name;  // "<variable>/<index>"
  DeviceName device;
  TaskKey task;
  int64_t version = 0;
  uint64_t checksum = 0;
  ReplicaState state = ReplicaState::kUninitialized;
};

struct VariableView {
  uint64_t id = 0;
  VariableDef def;
  int64_t version = 0;
  uint64_t checksum = 0;
  bool initialized = false;
  bool needs_resync = false;
  std::vector<std::string> collections;  // effective (V3)
  std::vector<ReplicaView> replicas;
};

struct CreateItem {
  VariableDef def;
  Initializer initializer;
};
struct CreateResult {
  std::vector<VariableView> variables;
  std::vector<bool> created;
  std::vector<std::string> warnings;
};

struct InitializeItem {
  std::string name;
  std::optional<Initializer> initializer;  // overrides the one given at create
};

struct Assignment {
  std::string name;
  AssignOp op = AssignOp::kAssign;
  std::shared_ptr<const Tensor> value;
};
struct WriteResult {
  int64_t version = 0;
  uint64_t checksum = 0;
  std::shared_ptr<const Tensor> value;  // the committed value
};
struct ReadResult {
  int64_t version = 0;
  std::shared_ptr<const Tensor> value;
};

}  // namespace repvar

#endif  // REPVAR_COMMON_MODEL_VARIABLE_H_
