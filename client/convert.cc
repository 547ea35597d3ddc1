// SPDX-License-Identifier: Apache-2.0
#include "client/convert.h"

#include <span>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_util.h"
#include "common/rpc/from_proto.h"
#include "common/rpc/to_proto.h"
#include "common/tensor/buffer.h"
#include "common/tensor/tensor.h"

namespace repvar::client_internal {

ReplicaInfo ReplicaFromProto(const v1::ReplicaInfo& p) {
  return ReplicaInfo{p.index(), p.name(),    p.device(),   p.job(),
                     p.task(),  p.version(), p.checksum(), static_cast<ReplicaState>(p.state())};
}

VariableInfo VariableFromProto(const v1::VariableInfo& p) {
  VariableInfo v;
  v.id = p.id();
  v.spec.name = p.spec().name();
  v.spec.dtype = static_cast<DType>(p.spec().tensor().dtype());
  v.spec.shape.assign(p.spec().tensor().dims().begin(), p.spec().tensor().dims().end());
  v.spec.trainable = p.spec().trainable();
  v.spec.collections.assign(p.spec().collections().begin(), p.spec().collections().end());
  v.spec.replica_count = p.spec().replica_count();
  v.spec.aggregation = static_cast<Aggregation>(p.spec().aggregation());
  v.spec.allow_nonfinite = p.spec().allow_nonfinite();
  v.version = p.version();
  v.checksum = p.checksum();
  v.initialized = p.initialized();
  v.needs_resync = p.needs_resync();
  v.collections.assign(p.collections().begin(), p.collections().end());
  for (const auto& r : p.replicas()) v.replicas.push_back(ReplicaFromProto(r));
  return v;
}

Topology TopologyFromProto(const v1::Topology& p) {
  Topology t;
  t.version = p.version();
  for (const auto& task : p.tasks()) {
    t.tasks.push_back(TaskInfo{
        task.job(), task.task(), task.address(), {task.devices().begin(), task.devices().end()}});
  }
  for (const auto& a : p.accelerators()) {
    t.accelerators.push_back(AcceleratorInfo{a.ordinal(), a.device(), a.job(), a.task()});
  }
  if (p.has_infeed_host()) {
    const auto& h = p.infeed_host();
    t.infeed_host = InfeedHost{h.job(), h.task(), h.address(), h.cpu_device()};
  }
  t.missing_tasks.assign(p.missing_tasks().begin(), p.missing_tasks().end());
  return t;
}

namespace {

// `data` copied into `v` as its bytes; whether they are what the sender
// summed (`checksum`).
bool TakeChecked(std::span<const std::byte> data, uint64_t checksum, TensorValue& v) {
  AssignBulk(v.bytes, data);
  v.checksum = Checksum(v.bytes);
  return v.checksum == checksum;
}

}  // namespace

absl::StatusOr<TensorValue> TensorValueFromProto(const v1::Tensor& t, int64_t version) {
  TensorValue v;
  v.dtype = static_cast<DType>(t.header().spec().dtype());
  v.shape.assign(t.header().spec().dims().begin(), t.header().spec().dims().end());
  const auto data = std::as_bytes(std::span<const char>(t.data().data(), t.data().size()));
  if (!TakeChecked(data, t.header().checksum(), v) || data.size() != t.header().byte_size()) {
    return absl::DataLossError("value received from the coordinator fails its checksum");
  }
  v.version = version;
  return v;
}

absl::StatusOr<std::span<const std::byte>> CheckedStepValue(const v1::Tensor& t,
                                                            const TensorSpec& spec) {
  const auto data = std::as_bytes(std::span<const char>(t.data().data(), t.data().size()));
  absl::StatusOr<TensorSpec> got = SpecFromProto(t.header().spec());
  // The step's layout says the size; the header and the bytes must agree.
  const uint64_t size = static_cast<uint64_t>(spec.ByteSize().value_or(0));
  if (!got.ok() || !(*got == spec)) return absl::DataLossError("a value of another spec");
  if (data.size() != size || t.header().byte_size() != size) {
    return absl::DataLossError(absl::StrCat("a value of ", data.size(), " bytes (its header: ",
                                            t.header().byte_size(), "), not ", size));
  }
  if (Checksum(data) != t.header().checksum()) {
    return absl::DataLossError("a value that fails its checksum");
  }
  return data;
}

absl::Status ForEachReadColumn(
    const v1::ReadColumns& p, size_t count,
    absl::FunctionRef<absl::Status(size_t i, const TensorSpec& spec, int64_t version,
                                   uint64_t checksum, std::span<const std::byte> data)>
        take) {
  auto malformed = [](auto&&... what) {
    return absl::DataLossError(absl::StrCat("the coordinator's read answer: ", what...));
  };
  for (const auto& [column, size] : {std::pair{"versions", p.versions_size()},
                                     {"spec_index", p.spec_index_size()},
                                     {"checksums", p.checksums_size()}}) {
    if (static_cast<size_t>(size) != count) {
      return malformed(size, " ", column, " for ", count, " variables");
    }
  }
  absl::StatusOr<SpecColumn> column = SpecColumnFromProto(p.specs());
  if (!column.ok()) return malformed(column.status().message());
  const std::vector<TensorSpec>& specs = column->specs;
  const std::vector<uint64_t>& sizes = column->bytes;
  const auto data = std::as_bytes(std::span<const char>(p.data().data(), p.data().size()));
  // The whole layout first: nothing is taken from an answer that is not
  // what it says.
  size_t offset = 0;
  for (size_t i = 0; i < count; ++i) {
    const int32_t s = p.spec_index(static_cast<int>(i));
    if (s < 0 || s >= static_cast<int32_t>(specs.size())) {
      return malformed("spec_index[", i, "] is ", s, " of ", specs.size(), " specs");
    }
    if (sizes[s] > data.size() - offset) {
      return malformed("value ", i, " is ", sizes[s], " bytes; ", data.size() - offset,
                       " are left");
    }
    offset += sizes[s];
  }
  if (offset != data.size()) return malformed(data.size() - offset, " bytes of data left over");
  offset = 0;
  for (size_t i = 0; i < count; ++i) {
    const int32_t s = p.spec_index(static_cast<int>(i));
    REPVAR_RETURN_IF_ERROR(take(i, specs[s], p.versions(static_cast<int>(i)),
                                p.checksums(static_cast<int>(i)), data.subspan(offset, sizes[s])));
    offset += sizes[s];
  }
  return absl::OkStatus();
}

absl::Status ValueFailsItsChecksum(size_t i) {
  return absl::DataLossError(
      absl::StrCat("value ", i, " received from the coordinator fails its checksum"));
}

absl::Status TakeValue(size_t i, const TensorSpec& spec, int64_t version, uint64_t checksum,
                       std::span<const std::byte> data, TensorValue& v) {
  v.dtype = spec.dtype;
  v.shape = spec.dims;
  v.version = version;
  return TakeChecked(data, checksum, v) ? absl::OkStatus() : ValueFailsItsChecksum(i);
}

absl::StatusOr<std::vector<TensorValue>> ReadColumnsFromProto(const v1::ReadColumns& p,
                                                              size_t count) {
  std::vector<TensorValue> out(count);
  REPVAR_RETURN_IF_ERROR(ForEachReadColumn(p, count,
                                           [&](size_t i, const TensorSpec& spec, int64_t version,
                                               uint64_t checksum, std::span<const std::byte> data) {
                                             return TakeValue(i, spec, version, checksum, data,
                                                              out[i]);
                                           }));
  return out;
}

StepEventInfo StepEventFromProto(const v1::StepEvent& e) {
  StepEventInfo info;
  info.seq = e.seq();
  info.kind = static_cast<StepEventInfo::Kind>(e.kind());
  info.step = e.step();
  info.epoch = e.epoch();
  if (!e.job().empty()) info.task = absl::StrCat(e.job(), ":", e.task());
  info.missing.assign(e.missing().begin(), e.missing().end());
  if (e.has_resolution()) {
    StepResolution r = ResolutionFromProto(e.resolution());
    info.committed = r.state == StepState::kCommitted;
    if (!info.committed) info.error = r.status.ToString();
  }
  return info;
}

void HeaderToProto(DType dtype, const std::vector<int64_t>& shape, std::span<const std::byte> bytes,
                   v1::TensorHeader* h) {
  SpecToProto(TensorSpec{dtype, shape}, h->mutable_spec());
  h->set_byte_size(bytes.size());
  h->set_checksum(Checksum(bytes));
}

void VariableSpecToProto(const VariableSpec& s, v1::VariableSpec* p) {
  p->set_name(s.name);
  SpecToProto(TensorSpec{s.dtype, s.shape}, p->mutable_tensor());
  p->set_trainable(s.trainable);
  for (const auto& c : s.collections) p->add_collections(c);
  p->set_replica_count(s.replica_count);
  p->set_aggregation(static_cast<v1::Aggregation>(s.aggregation));
  p->set_allow_nonfinite(s.allow_nonfinite);
}

absl::StatusOr<Initializer> InitializerFromSpec(const InitializerSpec& s, DType dtype,
                                                const std::vector<int64_t>& shape) {
  Initializer init;
  init.kind = s.kind;
  init.constant = s.constant;
  init.a = s.a;
  init.b = s.b;
  init.seed = s.seed;
  if (s.kind == InitializerKind::kValue) {
    auto t = Tensor::FromBytes(TensorSpec{dtype, shape}, s.value);
    if (!t.ok()) return t.status();
    init.value = std::make_shared<const Tensor>(*std::move(t));
  }
  return init;
}

StepResult StepResultOf(const StepResolution& r) {
  StepResult out;
  out.step = r.step;
  out.epoch = r.epoch;
  for (const CommittedVariable& c : r.changed) {
    out.changed.push_back(StepChange{c.name, c.version, c.checksum});
  }
  for (const Divergence& d : r.divergences) {
    out.divergences.push_back(
        StepDivergence{d.name, d.replica_checksums, d.chosen_checksum, d.repaired});
  }
  return out;
}

std::string ResolutionLine(const StepResolution& r) {
  std::string line = absl::StrCat("step ", r.step, " (epoch ", r.epoch, "): ");
  if (r.state == StepState::kCommitted) {
    absl::StrAppend(&line, "committed, ", r.changed.size(), " variable(s) changed");
    if (!r.divergences.empty()) {
      absl::StrAppend(&line, ", ", r.divergences.size(), " divergence(s) repaired");
    }
  } else {
    absl::StrAppend(&line, "FAILED: ", r.status.ToString());
  }
  std::vector<std::string> lat;
  for (const auto& [task, latency] : r.latencies) {
    lat.push_back(absl::StrCat(task.ToString(), " ", absl::ToInt64Milliseconds(latency), " ms"));
  }
  if (!lat.empty()) absl::StrAppend(&line, "; reports: ", absl::StrJoin(lat, ", "));
  return line;
}

StepsSummary StepsSummaryOf(const StepsStatus& st) {
  StepsSummary out;
  out.last_committed_step = st.last_committed_step;
  if (st.open) {
    // (Not emplace(): clang 14 cannot default-construct a nested struct
    // with member initializers through std::optional.)
    out.open = StepsSummary::Open{};
    StepsSummary::Open& open = *out.open;
    open.step = st.open->step;
    open.epoch = st.open->epoch;
    open.barrier_timeout = st.open->barrier_timeout;
    open.variables = static_cast<int>(st.open->variables.size());
    for (const ParticipantProgress& p : st.progress) {
      open.participants.push_back({p.task.ToString(), p.reported, p.finished, p.last_activity});
    }
  }
  for (const StepResolution& r : st.recent) {
    out.recent.push_back({r.step,
                          r.epoch,
                          r.state == StepState::kCommitted,
                          r.status.ok() ? "" : r.status.ToString(),
                          static_cast<int>(r.changed.size()),
                          static_cast<int>(r.divergences.size()),
                          {}});
    for (const auto& [task, latency] : r.latencies) {
      out.recent.back().latencies.push_back(StepWorkerLatency{task.job, task.task, latency});
    }
  }
  return out;
}

std::vector<std::string> StepsLines(const StepsStatus& st) {
  std::vector<std::string> out;
  out.push_back(absl::StrCat("last committed step: ", st.last_committed_step));
  if (st.open) {
    out.push_back(absl::StrCat(
        "open: step ", st.open->step, " (epoch ", st.open->epoch, "), barrier timeout ",
        absl::ToInt64Milliseconds(st.open->barrier_timeout), " ms, ", st.open->participants.size(),
        " participant(s), ", st.open->variables.size(), " variable(s)"));
    for (const ParticipantProgress& p : st.progress) {
      out.push_back(absl::StrCat("  ", p.task.ToString(), "  ", p.reported ? "reported" : "WAITING",
                                 "  ", p.last_activity));
    }
  } else {
    out.push_back("no step is open");
  }
  for (const StepResolution& r : st.recent) out.push_back(ResolutionLine(r));
  return out;
}

}  // namespace repvar::client_internal
