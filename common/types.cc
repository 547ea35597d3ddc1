// SPDX-License-Identifier: Apache-2.0
#include "repvar/types.h"

namespace repvar {

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat64:
      return "float64";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
  }
  return "UNKNOWN";
}

const char* AggregationName(Aggregation a) {
  switch (a) {
    case Aggregation::kNone:
      return "NONE";
    case Aggregation::kSum:
      return "SUM";
    case Aggregation::kMean:
      return "MEAN";
    case Aggregation::kOnlyFirstReplica:
      return "ONLY_FIRST_REPLICA";
  }
  return "UNKNOWN";
}

const char* ReplicaStateName(ReplicaState s) {
  switch (s) {
    case ReplicaState::kUninitialized:
      return "UNINITIALIZED";
    case ReplicaState::kUpToDate:
      return "UP_TO_DATE";
    case ReplicaState::kStale:
      return "STALE";
    case ReplicaState::kUnavailable:
      return "UNAVAILABLE";
  }
  return "UNKNOWN";
}

const char* StepStateName(StepState s) {
  switch (s) {
    case StepState::kOpen:
      return "OPEN";
    case StepState::kAggregating:
      return "AGGREGATING";
    case StepState::kCommitted:
      return "COMMITTED";
    case StepState::kFailed:
      return "FAILED";
  }
  return "UNKNOWN";
}

const char* AssignOpName(AssignOp op) {
  switch (op) {
    case AssignOp::kAssign:
      return "ASSIGN";
    case AssignOp::kAdd:
      return "ADD";
    case AssignOp::kSub:
      return "SUB";
  }
  return "UNKNOWN";
}

}  // namespace repvar
