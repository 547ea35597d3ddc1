// SPDX-License-Identifier: Apache-2.0
#ifndef REPVAR_COMMON_MODEL_REPLICA_WRITE_H_
#define REPVAR_COMMON_MODEL_REPLICA_WRITE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/model/collective.h"
#include "common/tensor/tensor.h"

namespace repvar {

// "Version `version` of variable `variable_id` is `value`" for some of the
// replicas one worker holds: what the coordinator sends and a worker applies.
struct ReplicaWrite {
  uint64_t variable_id = 0;
  std::string name;
  int64_t version = 0;
  std::vector<int32_t> replicas;
  std::shared_ptr<const Tensor> value;
  // Set when the bytes travel worker to worker over the data plane.
  std::optional<CollectiveSpec> collective;
};

// What a worker receives ahead of a write's bytes: the write (without its
// value), the tensor it announces and the incarnation it is meant for.
struct ReplicaWriteHeader {
  uint64_t incarnation = 0;
  ReplicaWrite write;  // value unset
  TensorHeader tensor;
};

}  // namespace repvar

#endif  // REPVAR_COMMON_MODEL_REPLICA_WRITE_H_
