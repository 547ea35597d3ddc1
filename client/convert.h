// SPDX-License-Identifier: Apache-2.0
// repvar.v1 messages <-> the public client types (repvar/client.h,
// repvar/step.h): the client library's one place for each direction. Model
// types go through common/rpc.
#ifndef REPVAR_CLIENT_CONVERT_H_
#define REPVAR_CLIENT_CONVERT_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "common/model/initializer.h"
#include "common/model/step.h"
#include "repvar/client.h"
#include "repvar/step.h"
#include "repvar/v1/coordinator.pb.h"
#include "repvar/v1/step.pb.h"

namespace repvar::client_internal {

ReplicaInfo ReplicaFromProto(const v1::ReplicaInfo& p);
VariableInfo VariableFromProto(const v1::VariableInfo& p);
Topology TopologyFromProto(const v1::Topology& p);
// Checks the checksum. Errors: DATA_LOSS.
absl::StatusOr<TensorValue> TensorValueFromProto(const v1::Tensor& t, int64_t version);
// Each of the `count` values of a batched read's answer by column, in
// order, handed to `take` with its spec, version, checksum and bytes (a view
// into `p`), once the whole answer's layout is what its columns say; `take`
// puts the bytes where they go and checks the checksum there. Errors:
// DATA_LOSS (columns that do not match `count` or each other, a spec this
// build does not read, bytes short or left over), or take's first.
absl::Status ForEachReadColumn(
    const v1::ReadColumns& p, size_t count,
    absl::FunctionRef<absl::Status(size_t i, const TensorSpec& spec, int64_t version,
                                   uint64_t checksum, std::span<const std::byte> data)>
        take);
// DATA_LOSS: value `i` of a batched read's answer fails its checksum.
absl::Status ValueFailsItsChecksum(size_t i);
// Value `i` of a batched read's answer (ForEachReadColumn's arguments)
// copied into `v` and checked there. Errors: DATA_LOSS (its checksum).
absl::Status TakeValue(size_t i, const TensorSpec& spec, int64_t version, uint64_t checksum,
                       std::span<const std::byte> data, TensorValue& v);
// The `count` values of a batched read's answer by column, each copied into
// its own vector and checked there. Errors: ForEachReadColumn's, DATA_LOSS
// for a checksum.
absl::StatusOr<std::vector<TensorValue>> ReadColumnsFromProto(const v1::ReadColumns& p,
                                                              size_t count);
StepEventInfo StepEventFromProto(const v1::StepEvent& e);
// The bytes of `t`, a worker's answer for a replica of a variable of
// `spec` (StepReadSmall), once its spec, size and checksum agree: a view
// into `t`. Errors: DATA_LOSS naming the fault.
absl::StatusOr<std::span<const std::byte>> CheckedStepValue(const v1::Tensor& t,
                                                            const TensorSpec& spec);

// The header announcing `bytes` as a tensor of (dtype, shape).
void HeaderToProto(DType dtype, const std::vector<int64_t>& shape, std::span<const std::byte> bytes,
                   v1::TensorHeader* h);
void VariableSpecToProto(const VariableSpec& s, v1::VariableSpec* p);
// Errors: INVALID_ARGUMENT (a kValue of the wrong size for dtype and shape).
absl::StatusOr<Initializer> InitializerFromSpec(const InitializerSpec& s, DType dtype,
                                                const std::vector<int64_t>& shape);

// A committed step's resolution as trainers see it.
StepResult StepResultOf(const StepResolution& r);
// "step 3 (epoch 11): committed, 2 variable(s) changed; reports: ..." (repvarctl steps).
std::string ResolutionLine(const StepResolution& r);
// The open step's progress and the last resolutions, one line each (repvarctl steps).
std::vector<std::string> StepsLines(const StepsStatus& st);
// The same as data.
StepsSummary StepsSummaryOf(const StepsStatus& st);

}  // namespace repvar::client_internal

#endif  // REPVAR_CLIENT_CONVERT_H_
