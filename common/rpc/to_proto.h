// SPDX-License-Identifier: Apache-2.0
// The model -> repvar.v1 messages: the one place each message is written.
#ifndef REPVAR_COMMON_RPC_TO_PROTO_H_
#define REPVAR_COMMON_RPC_TO_PROTO_H_

#include <cstdint>
#include <vector>

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

void SpecToProto(const TensorSpec& spec, v1::TensorSpec* proto);
void HeaderToProto(const Tensor& t, v1::TensorHeader* proto);
// A whole tensor in one message (copies the bytes once).
void TensorToProto(const Tensor& t, v1::Tensor* proto);
// The values of a batched read, by column (client/convert.h reads them).
void ReadColumnsToProto(const std::vector<ReadResult>& reads, v1::ReadColumns* proto);
// Small writes to one worker by column, each value whole (copies the bytes
// once); none may name a collective.
void SmallWritesToProto(uint64_t incarnation, const std::vector<ReplicaWrite>& writes,
                        v1::WriteSmallReplicasRequest* proto);
void InitializerToProto(const Initializer& init, v1::Initializer* proto);
void VariableDefToProto(const VariableDef& def, v1::VariableSpec* proto);
void VariableViewToProto(const VariableView& view, v1::VariableInfo* proto);
void TopologyToProto(const TopologySnapshot& topo, v1::Topology* proto);
void CollectiveToProto(const CollectiveSpec& c, v1::Collective* proto);
// `value_bytes_limit`: the committed value rides along (read_value) when it
// is at most this big.
void WriteResultToProto(const WriteResult& r, uint64_t value_bytes_limit,
                        v1::AssignVariableResponse* proto);

// Steps.
// `shared_lists`: each distinct replica -> participant list once
// (StepInfo.participant_lists), for a caller that asked for that form.
void StepInfoToProto(const StepInfo& info, v1::StepInfo* proto, bool shared_lists = false);
void ReportToProto(const WorkerReport& report, v1::ReportStepRequest* proto);
void FinishToProto(const WorkerFinish& finish, v1::FinishStepRequest* proto);
void PlanToProto(const StepPlan& plan, v1::StepPlan* proto);
// `short_form`: as workers get it (StepResolution::short_form).
void StepResolutionToProto(const StepResolution& r, v1::StepResolution* proto,
                           bool short_form = false);
void StepEventToProto(const StepEvent& e, v1::StepEvent* proto);
void StepsStatusToProto(const StepsStatus& st, v1::StepsStatus* proto);

}  // namespace repvar

#endif  // REPVAR_COMMON_RPC_TO_PROTO_H_
