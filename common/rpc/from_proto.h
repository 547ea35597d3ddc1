// SPDX-License-Identifier: Apache-2.0
// repvar.v1 messages -> the model: the one place each message is read.
// Every function validates what it reads (a peer or a user wrote it) and
// answers INVALID_ARGUMENT naming the field; nothing is half-converted.
#ifndef REPVAR_COMMON_RPC_FROM_PROTO_H_
#define REPVAR_COMMON_RPC_FROM_PROTO_H_

#include <cstdint>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/initializer.h"
#include "common/model/replica_write.h"
#include "common/model/step.h"
#include "common/model/topology.h"
#include "common/model/variable.h"
#include "common/tensor/tensor.h"
#include "repvar/v1/coordinator.pb.h"
#include "repvar/v1/step.pb.h"
#include "repvar/v1/types.pb.h"
#include "repvar/v1/worker.pb.h"

namespace repvar {

// Errors: INVALID_ARGUMENT (unknown dtype, bad shape).
absl::StatusOr<TensorSpec> SpecFromProto(const v1::TensorSpec& proto);
// A column of distinct specs (WriteSmallReplicas, ReadColumns), with the
// bytes a value of each takes. Errors: as SpecFromProto, for the first bad
// one.
struct SpecColumn {
  std::vector<TensorSpec> specs;
  std::vector<uint64_t> bytes;
};
absl::StatusOr<SpecColumn> SpecColumnFromProto(
    const google::protobuf::RepeatedPtrField<v1::TensorSpec>& proto);
// Errors: INVALID_ARGUMENT (bad spec).
absl::StatusOr<TensorHeader> TensorHeaderFromProto(const v1::TensorHeader& proto);
// A whole tensor in one message. Errors: INVALID_ARGUMENT (bad spec, length
// or checksum).
absl::StatusOr<Tensor> TensorFromProto(const v1::Tensor& proto);
// Errors: INVALID_ARGUMENT (bad embedded tensor, unknown generator).
absl::StatusOr<Initializer> InitializerFromProto(const v1::Initializer& proto);
// UNSPECIFIED reads as the documented default. Errors: INVALID_ARGUMENT.
absl::StatusOr<Aggregation> AggregationFromProto(int proto);
absl::StatusOr<AssignOp> AssignOpFromProto(int proto);
absl::StatusOr<VariableDetail> VariableDetailFromProto(int proto);
// Errors: INVALID_ARGUMENT (name, spec, aggregation).
absl::StatusOr<VariableDef> VariableDefFromProto(const v1::VariableSpec& proto);
WorkerRegistration RegistrationFromProto(const v1::RegisterWorkerRequest& proto);
CollectiveSpec CollectiveFromProto(const v1::Collective& proto);
// Errors: INVALID_ARGUMENT (bad tensor header).
absl::StatusOr<ReplicaWriteHeader> WriteHeaderFromProto(const v1::WriteReplicasHeader& proto);
// The writes refer to `proto`'s bytes, which must outlive them. Errors:
// INVALID_ARGUMENT (columns of unequal lengths, a bad spec or spec index,
// replica counts or value sizes that do not add up to what is there).
absl::StatusOr<SmallReplicaWrites> SmallWritesFromProto(const v1::WriteSmallReplicasRequest& proto);
absl::StatusOr<StepWriteHeader> StepWriteHeaderFromProto(const v1::StepWriteHeader& proto);

// Steps. Errors: INVALID_ARGUMENT (a bad spec in the layout).
absl::StatusOr<StepInfo> StepInfoFromProto(const v1::StepInfo& proto);
// Errors: INVALID_ARGUMENT (malformed index ranges).
absl::StatusOr<WorkerReport> ReportFromProto(const v1::ReportStepRequest& proto);
absl::StatusOr<WorkerFinish> FinishFromProto(const v1::FinishStepRequest& proto);
StepResolution ResolutionFromProto(const v1::StepResolution& proto);
// The answer to a report: the plan, or the resolution when there is nothing
// to run (or the step failed). Errors: INVALID_ARGUMENT (malformed index
// ranges).
absl::StatusOr<std::variant<StepPlan, StepResolution>> PlanFromProto(const v1::StepPlan& proto);
// Errors: as StepInfoFromProto.
absl::StatusOr<StepsStatus> StepsStatusFromProto(const v1::StepsStatus& proto);

}  // namespace repvar

#endif  // REPVAR_COMMON_RPC_FROM_PROTO_H_
