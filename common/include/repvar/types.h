// SPDX-License-Identifier: Apache-2.0
// The vocabulary every layer of repvar shares, defined once: element types,
// aggregation rules, replica and step states, assign operations,
// initializer kinds and what an initialize call did. The public client headers use it, so it
// installs with the client library. Numbers match the repvar.v1 protobuf enums; the conversions in
// common/rpc check the range before casting.
#ifndef REPVAR_TYPES_H_
#define REPVAR_TYPES_H_

#include <cstdint>
#include <string>

namespace repvar {

// Element types. Bytes are little-endian, row-major; float16 and bfloat16
// travel as uint16_t bit patterns.
enum class DType : int {
  kFloat32 = 1,
  kFloat16 = 2,
  kBFloat16 = 3,
  kFloat64 = 4,
  kInt32 = 5,
  kInt64 = 6,
};

// How in-step replica values combine when a step commits (docs/contract.md S4).
enum class Aggregation : int { kNone = 1, kSum = 2, kMean = 3, kOnlyFirstReplica = 4 };

// What a replica holds, as the coordinator records it (see
// server/core/replica_state.h for the transitions).
enum class ReplicaState : int { kUninitialized = 1, kUpToDate = 2, kStale = 3, kUnavailable = 4 };

// How much of each variable an answer about many variables carries: kBasic
// leaves the replicas out (a thousand variables on eight accelerators
// answer without eight thousand replica entries).
enum class VariableDetail : int { kFull = 1, kBasic = 2 };

// A cross-replica write: the value, or a delta added to / subtracted from the
// committed value (C3).
enum class AssignOp : int { kAssign = 1, kAdd = 2, kSub = 3 };

// Whether a write of `op` returns the new value when the caller does not say:
// the seed's defaults (`assign(read_value=False)`, `assign_add` and
// `assign_sub` with `read_value=True`).
constexpr bool ReadValueByDefault(AssignOp op) { return op != AssignOp::kAssign; }

// The life of a replicated step (see server/core/step_barrier.h).
enum class StepState : int { kOpen = 1, kAggregating = 2, kCommitted = 3, kFailed = 4 };

// How a variable gets its first value; the coordinator generates it once.
enum class InitializerKind : int {
  kNone = 0,
  kZeros = 1,
  kOnes = 2,
  kConstant = 3,
  kRandomNormal = 4,
  kRandomUniform = 5,
  kValue = 6,
};

// What an initialize call did to one variable (C5): the first caller wins.
struct InitializeResult {
  std::string name;
  bool initialized_now = false;  // false: someone else initialized it first
  int64_t version = 0;
  uint64_t checksum = 0;
};

// Names as the API and the logs spell them ("float32", "MEAN",
// "UP_TO_DATE", "COMMITTED", "ADD"); "UNKNOWN" for a value out of range.
const char* DTypeName(DType dtype);
const char* AggregationName(Aggregation aggregation);
const char* ReplicaStateName(ReplicaState state);
const char* StepStateName(StepState state);
const char* AssignOpName(AssignOp op);

}  // namespace repvar

#endif  // REPVAR_TYPES_H_
