// SPDX-License-Identifier: Apache-2.0
#include "common/rpc/from_proto.h"

#include <algorithm>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/base/status_util.h"
#include "common/model/names.h"
#include "common/rpc/chunks.h"

namespace repvar {

absl::StatusOr<TensorSpec> SpecFromProto(const v1::TensorSpec& proto) {
  TensorSpec spec;
  if (proto.dtype() == v1::DTYPE_UNSPECIFIED) {
    return absl::InvalidArgumentError("dtype is unset (DTYPE_UNSPECIFIED)");
  }
  REPVAR_ASSIGN_OR_RETURN(spec.dtype, DTypeFromInt(proto.dtype()));
  spec.dims.assign(proto.dims().begin(), proto.dims().end());
  REPVAR_RETURN_IF_ERROR(spec.ByteSize().status());
  return spec;
}

absl::StatusOr<TensorHeader> TensorHeaderFromProto(const v1::TensorHeader& proto) {
  REPVAR_ASSIGN_OR_RETURN(TensorSpec spec, SpecFromProto(proto.spec()));
  return TensorHeader{std::move(spec), proto.byte_size(), proto.checksum()};
}

absl::StatusOr<Tensor> TensorFromProto(const v1::Tensor& proto) {
  REPVAR_ASSIGN_OR_RETURN(TensorSpec spec, SpecFromProto(proto.header().spec()));
  const std::string& data = proto.data();
  CountReceivedTensorBytes(data.size());
  if (proto.header().byte_size() != data.size()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor header says ",
                                                   proto.header().byte_size(),
                                                   " bytes, the message carries ", data.size()));
  }
  REPVAR_ASSIGN_OR_RETURN(Tensor t, Tensor::FromBytes(spec, BytesOf(data)));
  // 0: the sender gave none (docs/wire.md); t.checksum is computed either way.
  if (proto.header().checksum() != kChecksumNotGiven && t.checksum != proto.header().checksum()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor checksum mismatch: header says ",
                                                   proto.header().checksum(), ", bytes give ",
                                                   t.checksum));
  }
  return t;
}

absl::StatusOr<Initializer> InitializerFromProto(const v1::Initializer& proto) {
  Initializer init;
  using K = InitializerKind;
  auto check_gen = [](v1::RandomGenerator g) -> absl::Status {
    if (g == v1::RANDOM_GENERATOR_UNSPECIFIED || g == v1::RANDOM_GENERATOR_SPLITMIX64_V1) {
      return absl::OkStatus();
    }
    return absl::InvalidArgumentError(absl::StrCat("unknown random generator ", g));
  };
  switch (proto.kind_case()) {
    case v1::Initializer::KIND_NOT_SET:
      init.kind = K::kNone;
      break;
    case v1::Initializer::kConstant:
      init.kind = K::kConstant;
      init.constant = proto.constant();
      break;
    case v1::Initializer::kZeros:
      init.kind = K::kZeros;
      break;
    case v1::Initializer::kOnes:
      init.kind = K::kOnes;
      break;
    case v1::Initializer::kValue: {
      init.kind = K::kValue;
      REPVAR_ASSIGN_OR_RETURN(Tensor t, TensorFromProto(proto.value()));
      init.value = std::make_shared<const Tensor>(std::move(t));
      break;
    }
    case v1::Initializer::kRandomNormal:
      REPVAR_RETURN_IF_ERROR(check_gen(proto.random_normal().generator()));
      init.kind = K::kRandomNormal;
      init.a = proto.random_normal().mean();
      init.b = proto.random_normal().stddev();
      init.seed = proto.random_normal().seed();
      break;
    case v1::Initializer::kRandomUniform:
      REPVAR_RETURN_IF_ERROR(check_gen(proto.random_uniform().generator()));
      init.kind = K::kRandomUniform;
      init.a = proto.random_uniform().minval();
      init.b = proto.random_uniform().maxval();
      init.seed = proto.random_uniform().seed();
      break;
  }
  return init;
}

absl::StatusOr<Aggregation> AggregationFromProto(int proto) {
  if (proto == v1::AGGREGATION_UNSPECIFIED) return Aggregation::kNone;
  if (proto < v1::AGGREGATION_NONE || proto > v1::AGGREGATION_ONLY_FIRST_REPLICA) {
    return absl::InvalidArgumentError(absl::StrCat("unknown aggregation ", proto));
  }
  return static_cast<Aggregation>(proto);
}

static_assert(static_cast<int>(VariableDetail::kFull) == v1::VARIABLE_DETAIL_FULL &&
              static_cast<int>(VariableDetail::kBasic) == v1::VARIABLE_DETAIL_BASIC);

absl::StatusOr<VariableDetail> VariableDetailFromProto(int proto) {
  if (proto == v1::VARIABLE_DETAIL_UNSPECIFIED) return VariableDetail::kFull;
  if (proto < v1::VARIABLE_DETAIL_FULL || proto > v1::VARIABLE_DETAIL_BASIC) {
    return absl::InvalidArgumentError(absl::StrCat("unknown variable detail ", proto));
  }
  return static_cast<VariableDetail>(proto);
}

absl::StatusOr<AssignOp> AssignOpFromProto(int proto) {
  if (proto == v1::ASSIGN_OP_UNSPECIFIED) return AssignOp::kAssign;
  if (proto < v1::ASSIGN_OP_ASSIGN || proto > v1::ASSIGN_OP_SUB) {
    return absl::InvalidArgumentError("unknown assign op");
  }
  return static_cast<AssignOp>(proto);
}

absl::StatusOr<VariableDef> VariableDefFromProto(const v1::VariableSpec& proto) {
  VariableDef def;
  def.name = proto.name();
  REPVAR_RETURN_IF_ERROR(ValidateVariableName(def.name));
  auto spec = SpecFromProto(proto.tensor());
  if (!spec.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("variable ", def.name, ": ", spec.status().message()));
  }
  def.tensor = *std::move(spec);
  def.trainable = proto.trainable();
  def.collections.assign(proto.collections().begin(), proto.collections().end());
  std::sort(def.collections.begin(), def.collections.end());
  def.collections.erase(std::unique(def.collections.begin(), def.collections.end()),
                        def.collections.end());
  def.replica_count = proto.replica_count();
  auto agg = AggregationFromProto(proto.aggregation());
  if (!agg.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("variable ", def.name, ": ", agg.status().message()));
  }
  def.aggregation = *agg;
  def.allow_nonfinite = proto.allow_nonfinite();
  return def;
}

WorkerRegistration RegistrationFromProto(const v1::RegisterWorkerRequest& proto) {
  return WorkerRegistration{proto.job(),
                            proto.task(),
                            proto.address(),
                            proto.incarnation(),
                            {proto.devices().begin(), proto.devices().end()}};
}

CollectiveSpec CollectiveFromProto(const v1::Collective& c) {
  return CollectiveSpec{c.group(), c.rank(), c.size(),
                        c.root(),  c.tag(),  absl::Milliseconds(c.timeout_ms())};
}

absl::StatusOr<ReplicaWriteHeader> WriteHeaderFromProto(const v1::WriteReplicasHeader& proto) {
  ReplicaWriteHeader h;
  h.incarnation = proto.incarnation();
  h.write.variable_id = proto.variable_id();
  h.write.name = proto.name();
  h.write.version = proto.version();
  h.write.fence = proto.fence();
  h.write.replicas.assign(proto.replicas().begin(), proto.replicas().end());
  if (proto.has_collective()) h.write.collective = CollectiveFromProto(proto.collective());
  REPVAR_ASSIGN_OR_RETURN(h.tensor, TensorHeaderFromProto(proto.tensor()));
  return h;
}

absl::StatusOr<SpecColumn> SpecColumnFromProto(
    const google::protobuf::RepeatedPtrField<v1::TensorSpec>& proto) {
  SpecColumn out;
  out.specs.reserve(proto.size());
  out.bytes.reserve(proto.size());
  for (const v1::TensorSpec& p : proto) {
    REPVAR_ASSIGN_OR_RETURN(TensorSpec spec, SpecFromProto(p));
    out.bytes.push_back(static_cast<uint64_t>(*spec.ByteSize()));  // checked by SpecFromProto
    out.specs.push_back(std::move(spec));
  }
  return out;
}

namespace {

// Every column of a small-writes message has one entry per write.
absl::Status CheckSmallWriteColumns(const v1::WriteSmallReplicasRequest& proto) {
  const int n = proto.variable_ids_size();
  for (const auto& [column, size] : {std::pair{"names", proto.names_size()},
                                     {"versions", proto.versions_size()},
                                     {"fences", proto.fences_size()},
                                     {"replica_counts", proto.replica_counts_size()},
                                     {"spec_index", proto.spec_index_size()},
                                     {"checksums", proto.checksums_size()}}) {
    if (size != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("small writes: ", n, " variable ids but ", size, " ", column));
    }
  }
  if (proto.value_index_size() > 0 && proto.value_index_size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("small writes: ", n, " variable ids but ",
                                                   proto.value_index_size(), " value_index"));
  }
  return absl::OkStatus();
}

// Where the walk over a small-writes message's writes is: the distinct
// values so far (where each is in `data`, and its spec), the next write's
// first entry in `replicas`, the next value's first byte in `data`.
struct SmallWriteWalk {
  struct Value {
    std::span<const std::byte> bytes;
    int32_t spec = 0;
  };
  std::span<const std::byte> data;
  const std::vector<uint64_t>* sizes = nullptr;  // per spec
  std::vector<Value> values;
  size_t replica = 0;
  size_t offset = 0;
};

// Write `i`'s value: the next in `data` when it is a new one, else one
// before it of the same spec.
absl::StatusOr<int32_t> TakeSmallValue(const v1::WriteSmallReplicasRequest& proto, int i,
                                       int32_t spec, const std::vector<TensorSpec>& specs,
                                       SmallWriteWalk& walk) {
  const int32_t value = proto.value_index_size() > 0 ? proto.value_index(i) : i;
  if (value < 0 || static_cast<size_t>(value) > walk.values.size()) {
    return absl::InvalidArgumentError(absl::StrCat("small writes: value_index[", i, "] is ", value,
                                                   " after ", walk.values.size(), " values"));
  }
  const uint64_t size = (*walk.sizes)[spec];
  if (static_cast<size_t>(value) == walk.values.size()) {  // a new value: its bytes are next
    if (size > walk.data.size() - walk.offset) {
      return absl::InvalidArgumentError(absl::StrCat("small writes: value ", value, " is ", size,
                                                     " bytes; ", walk.data.size() - walk.offset,
                                                     " bytes of data are left"));
    }
    walk.values.push_back({walk.data.subspan(walk.offset, size), spec});
    walk.offset += size;
  } else if (!(specs[walk.values[value].spec] == specs[spec])) {
    return absl::InvalidArgumentError(absl::StrCat("small writes: write ", i, " shares value ",
                                                   value, " but has spec ", spec, ", not ",
                                                   walk.values[value].spec));
  }
  return value;
}

// Write `i` of the message, checked against what the walk has seen.
absl::StatusOr<SmallReplicaWrites::Item> TakeSmallWrite(const v1::WriteSmallReplicasRequest& proto,
                                                        int i, const std::vector<TensorSpec>& specs,
                                                        SmallWriteWalk& walk) {
  const size_t replica_entries = static_cast<size_t>(proto.replicas_size());
  const int32_t count = proto.replica_counts(i);
  if (count < 0 || static_cast<size_t>(count) > replica_entries - walk.replica) {
    return absl::InvalidArgumentError(absl::StrCat("small writes: replica_counts[", i, "] is ",
                                                   count, "; ", replica_entries - walk.replica,
                                                   " replica entries are left"));
  }
  const int32_t spec = proto.spec_index(i);
  if (spec < 0 || spec >= proto.specs_size()) {
    return absl::InvalidArgumentError(absl::StrCat("small writes: spec_index[", i, "] is ", spec,
                                                   " of ", proto.specs_size(), " specs"));
  }
  REPVAR_ASSIGN_OR_RETURN(const int32_t value, TakeSmallValue(proto, i, spec, specs, walk));
  SmallReplicaWrites::Item item;
  item.write.variable_id = proto.variable_ids(i);
  item.write.name = proto.names(i);
  item.write.version = proto.versions(i);
  item.write.fence = proto.fences(i);
  item.write.replicas.assign(proto.replicas().begin() + walk.replica,
                             proto.replicas().begin() + walk.replica + count);
  item.spec = static_cast<size_t>(spec);
  item.checksum = proto.checksums(i);
  item.value = static_cast<size_t>(value);
  item.bytes = walk.values[value].bytes;
  walk.replica += count;
  return item;
}

}  // namespace

absl::StatusOr<SmallReplicaWrites> SmallWritesFromProto(
    const v1::WriteSmallReplicasRequest& proto) {
  REPVAR_RETURN_IF_ERROR(CheckSmallWriteColumns(proto));
  REPVAR_ASSIGN_OR_RETURN(SpecColumn column, SpecColumnFromProto(proto.specs()));
  SmallReplicaWrites out;
  out.incarnation = proto.incarnation();
  out.specs = std::move(column.specs);
  SmallWriteWalk walk;
  walk.data = BytesOf(proto.data());
  walk.sizes = &column.bytes;
  CountReceivedTensorBytes(walk.data.size());
  const int n = proto.variable_ids_size();
  out.items.reserve(n);
  for (int i = 0; i < n; ++i) {
    REPVAR_ASSIGN_OR_RETURN(SmallReplicaWrites::Item item,
                            TakeSmallWrite(proto, i, out.specs, walk));
    out.items.push_back(std::move(item));
  }
  const size_t replica_entries = static_cast<size_t>(proto.replicas_size());
  if (walk.replica != replica_entries || walk.offset != walk.data.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("small writes: ", replica_entries - walk.replica, " replica entries and ",
                     walk.data.size() - walk.offset, " bytes of data belong to no write"));
  }
  return out;
}

absl::StatusOr<StepWriteHeader> StepWriteHeaderFromProto(const v1::StepWriteHeader& proto) {
  StepWriteHeader h;
  h.step = proto.step();
  h.epoch = proto.epoch();
  h.variable_id = proto.variable_id();
  h.replica = proto.replica();
  REPVAR_ASSIGN_OR_RETURN(h.tensor, TensorHeaderFromProto(proto.tensor()));
  h.layout_id = proto.layout_id();
  h.barrier_timeout = absl::Milliseconds(proto.barrier_timeout_ms());
  return h;
}

absl::StatusOr<StepInfo> StepInfoFromProto(const v1::StepInfo& proto) {
  StepInfo info;
  info.step = proto.step();
  info.epoch = proto.epoch();
  info.state = proto.state() >= v1::STEP_STATE_OPEN && proto.state() <= v1::STEP_STATE_FAILED
                   ? static_cast<StepState>(proto.state())
                   : StepState::kOpen;
  info.barrier_timeout = absl::Milliseconds(proto.barrier_timeout_ms());
  info.begun = absl::FromUnixMillis(proto.begun_unix_ms());
  info.layout_id = proto.layout_id();
  info.layout_omitted = proto.layout_omitted();
  for (const v1::StepParticipant& p : proto.sitting_out()) {
    info.sitting_out.push_back(TaskKey{p.job(), p.task()});
  }
  info.participants.reserve(proto.participants_size());
  for (const v1::StepParticipant& p : proto.participants()) {
    info.participants.push_back(
        StepParticipant{{p.job(), p.task()}, 0, p.address(), p.incarnation_digest()});
  }
  std::vector<SharedVector<int32_t>> lists;
  for (const v1::ParticipantList& l : proto.participant_lists()) {
    lists.emplace_back(
        std::vector<int32_t>(l.replica_participant().begin(), l.replica_participant().end()));
  }
  info.variables.reserve(proto.variables_size());
  for (const v1::StepVariable& v : proto.variables()) {
    StepVariable sv;
    sv.id = v.id();
    sv.name = v.name();
    REPVAR_ASSIGN_OR_RETURN(sv.aggregation, AggregationFromProto(v.aggregation()));
    REPVAR_ASSIGN_OR_RETURN(sv.spec, SpecFromProto(v.spec()));
    if (v.participant_list() == 0) {
      sv.replica_participant =
          std::vector<int32_t>(v.replica_participant().begin(), v.replica_participant().end());
    } else if (v.participant_list() <= lists.size() && v.replica_participant().empty()) {
      sv.replica_participant = lists[v.participant_list() - 1];
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("step variable ", v.name(), " names participant list ", v.participant_list(),
                       " of ", lists.size(), " (or lists its own too)"));
    }
    sv.allow_nonfinite = v.allow_nonfinite();
    info.variables.push_back(std::move(sv));
  }
  return info;
}

namespace {

absl::StatusOr<IndexRanges> RangesFromProto(const google::protobuf::RepeatedField<uint32_t>& p) {
  // Checked against the layout's size by whoever holds the layout.
  return IndexRanges::FromBounds({p.begin(), p.end()}, std::numeric_limits<uint32_t>::max());
}

template <typename P>
std::vector<VariableChecksum> ShardFromProto(const P& proto) {
  std::vector<VariableChecksum> out;
  out.reserve(proto.shard_size());
  for (const v1::VariableChecksum& c : proto.shard()) {
    out.push_back(VariableChecksum{c.variable_id(), c.checksum()});
  }
  return out;
}

}  // namespace

absl::StatusOr<WorkerReport> ReportFromProto(const v1::ReportStepRequest& req) {
  WorkerReport r;
  r.step = req.step();
  r.epoch = req.epoch();
  r.task = TaskKey{req.job(), req.task()};
  r.incarnation = req.incarnation();
  REPVAR_ASSIGN_OR_RETURN(r.changed, RangesFromProto(req.changed_ranges()));
  r.digest = req.digest();
  r.shard = ShardFromProto(req);
  r.detailed = req.detailed();
  r.replicas.reserve(req.replicas_size());
  for (const v1::ReplicaReport& rr : req.replicas()) {
    r.replicas.push_back(
        ReplicaReport{rr.variable_id(), rr.replica(), rr.checksum(), rr.first_nonfinite()});
  }
  return r;
}
absl::StatusOr<WorkerFinish> FinishFromProto(const v1::FinishStepRequest& req) {
  WorkerFinish f;
  f.step = req.step();
  f.epoch = req.epoch();
  f.task = TaskKey{req.job(), req.task()};
  f.incarnation = req.incarnation();
  f.error = req.error();
  REPVAR_ASSIGN_OR_RETURN(f.held, RangesFromProto(req.held_ranges()));
  f.digest = req.digest();
  f.shard = ShardFromProto(req);
  for (const v1::PreparedVariable& p : req.nonfinite()) {
    f.nonfinite.push_back(PreparedVariable{p.variable_id(), p.checksum(), p.first_nonfinite(),
                                           p.has_nonfinite_replica() ? p.nonfinite_replica() : -1});
  }
  return f;
}
StepResolution ResolutionFromProto(const v1::StepResolution& proto) {
  StepResolution r;
  r.step = proto.step();
  r.epoch = proto.epoch();
  r.state = proto.state() == v1::STEP_STATE_COMMITTED ? StepState::kCommitted : StepState::kFailed;
  if (r.state == StepState::kFailed) {
    // A failed step always carries an error; UNKNOWN when the peer gave none.
    const int code =
        proto.code() == 0 ? static_cast<int>(absl::StatusCode::kUnknown) : proto.code();
    r.status = absl::Status(static_cast<absl::StatusCode>(code), proto.message());
  }
  for (const v1::WorkerStepLatency& l : proto.latencies()) {
    r.latencies.emplace_back(TaskKey{l.job(), l.task()}, absl::Milliseconds(l.report_ms()));
  }
  for (const v1::Divergence& d : proto.divergences()) {
    r.divergences.push_back(Divergence{d.variable_id(),
                                       d.name(),
                                       {d.replica_checksums().begin(), d.replica_checksums().end()},
                                       d.chosen_checksum(),
                                       {d.repaired().begin(), d.repaired().end()}});
  }
  for (const v1::CommittedVariable& c : proto.changed()) {
    r.changed.push_back(CommittedVariable{c.variable_id(), c.name(), c.version(), c.checksum()});
  }
  r.changed_digest = proto.changed_digest();
  r.layout_id = proto.layout_id();
  r.short_form = proto.short_form();
  absl::StatusOr<IndexRanges> ranges = RangesFromProto(proto.changed_ranges());
  if (ranges.ok()) {
    r.changed_ranges = *std::move(ranges);
  } else if (r.state == StepState::kCommitted) {
    // Only a broken coordinator sends this; nothing of it is installed.
    r.state = StepState::kFailed;
    r.status = absl::DataLossError(
        absl::StrCat("a malformed step resolution: ", ranges.status().message()));
  }
  return r;
}

absl::StatusOr<std::variant<StepPlan, StepResolution>> PlanFromProto(const v1::StepPlan& proto) {
  if (proto.has_resolution()) return ResolutionFromProto(proto.resolution());
  StepPlan plan;
  plan.step = proto.step();
  plan.epoch = proto.epoch();
  plan.group = proto.group();
  plan.timeout = absl::Milliseconds(proto.timeout_ms());
  for (const v1::StepCollective& c : proto.collectives()) {
    StepCollective sc;
    sc.kind = c.kind() == v1::StepCollective::BROADCAST ? StepCollective::Kind::kBroadcast
                                                        : StepCollective::Kind::kAllreduce;
    sc.tag = c.tag();
    REPVAR_ASSIGN_OR_RETURN(sc.variables, RangesFromProto(c.variable_ranges()));
    sc.root = c.root();
    sc.source_replica = c.source_replica();
    sc.checksum = c.checksum();
    sc.targets.assign(c.targets().begin(), c.targets().end());
    plan.collectives.push_back(std::move(sc));
  }
  REPVAR_ASSIGN_OR_RETURN(plan.changed, RangesFromProto(proto.changed_ranges()));
  plan.send_detail = proto.send_detail();
  return plan;
}

absl::StatusOr<StepsStatus> StepsStatusFromProto(const v1::StepsStatus& proto) {
  StepsStatus st;
  if (proto.has_open()) {
    REPVAR_ASSIGN_OR_RETURN(st.open, StepInfoFromProto(proto.open()));
  }
  for (const v1::ParticipantProgress& p : proto.progress()) {
    st.progress.push_back(ParticipantProgress{{p.job(), p.task()},
                                              p.reported(),
                                              p.finished(),
                                              absl::Milliseconds(p.report_ms()),
                                              p.last_activity()});
  }
  for (const v1::StepResolution& r : proto.recent()) st.recent.push_back(ResolutionFromProto(r));
  st.last_committed_step = proto.last_committed_step();
  return st;
}

}  // namespace repvar
