// SPDX-License-Identifier: Apache-2.0
#include "common/rpc/to_proto.h"

#include <string>

#include "absl/container/flat_hash_map.h"
#include "common/base/random.h"
#include "common/rpc/chunks.h"

namespace repvar {

void SpecToProto(const TensorSpec& spec, v1::TensorSpec* proto) {
  proto->set_dtype(static_cast<v1::DType>(spec.dtype));
  proto->mutable_dims()->Assign(spec.dims.begin(), spec.dims.end());
}

namespace {

// The distinct specs of a column of values (WriteSmallReplicas,
// ReadColumns), listed in `out` as first met. Values sent together mostly
// share a spec, so each is compared with the last few listed; one seen
// further back is listed again, which costs a few bytes.
class SpecColumnWriter {
 public:
  explicit SpecColumnWriter(google::protobuf::RepeatedPtrField<v1::TensorSpec>* out) : out_(out) {}

  // The index of `spec` in `out`, listed there if it is new. `spec` must
  // outlive the writer.
  int32_t IndexOf(const TensorSpec& spec) {
    for (size_t k = listed_.size(); k > 0 && listed_.size() - k < kCompared; --k) {
      if (*listed_[k - 1] == spec) return static_cast<int32_t>(k - 1);
    }
    listed_.push_back(&spec);
    SpecToProto(spec, out_->Add());
    return static_cast<int32_t>(listed_.size() - 1);
  }

 private:
  static constexpr size_t kCompared = 4;
  google::protobuf::RepeatedPtrField<v1::TensorSpec>* const out_;
  std::vector<const TensorSpec*> listed_;
};

}  // namespace

void HeaderToProto(const Tensor& t, v1::TensorHeader* proto) {
  SpecToProto(t.spec, proto->mutable_spec());
  proto->set_byte_size(t.bytes.size());
  proto->set_checksum(t.checksum);
}

void TensorToProto(const Tensor& t, v1::Tensor* proto) {
  HeaderToProto(t, proto->mutable_header());
  proto->set_data(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
  CountSentTensorBytes(t.bytes.size());
}

void ReadColumnsToProto(const std::vector<ReadResult>& reads, v1::ReadColumns* proto) {
  const int n = static_cast<int>(reads.size());
  proto->mutable_versions()->Reserve(n);
  proto->mutable_spec_index()->Reserve(n);
  proto->mutable_checksums()->Reserve(n);
  size_t bytes = 0;
  for (const ReadResult& r : reads) bytes += r.value->bytes.size();
  std::string* data = proto->mutable_data();
  data->reserve(bytes);
  SpecColumnWriter specs(proto->mutable_specs());
  for (const ReadResult& r : reads) {
    const Tensor& t = *r.value;
    proto->add_versions(r.version);
    proto->add_spec_index(specs.IndexOf(t.spec));
    proto->add_checksums(t.checksum);
    data->append(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
  }
  CountSentTensorBytes(bytes);
}

void SmallWritesToProto(uint64_t incarnation, const std::vector<ReplicaWrite>& writes,
                        v1::WriteSmallReplicasRequest* proto) {
  proto->set_incarnation(incarnation);
  const int n = static_cast<int>(writes.size());
  proto->mutable_variable_ids()->Reserve(n);
  proto->mutable_names()->Reserve(n);
  proto->mutable_versions()->Reserve(n);
  proto->mutable_fences()->Reserve(n);
  proto->mutable_replica_counts()->Reserve(n);
  proto->mutable_spec_index()->Reserve(n);
  proto->mutable_checksums()->Reserve(n);
  // A value several writes share (variables initialized alike) is sent
  // once.
  absl::flat_hash_map<const Tensor*, int32_t> values;
  values.reserve(writes.size());
  size_t bytes = 0;
  for (const ReplicaWrite& w : writes) {
    if (values.try_emplace(w.value.get(), 0).second) bytes += w.value->bytes.size();
  }
  const bool shared = values.size() < writes.size();
  if (shared) proto->mutable_value_index()->Reserve(n);
  int32_t distinct = 0;
  std::string* data = proto->mutable_data();
  data->reserve(bytes);
  SpecColumnWriter specs(proto->mutable_specs());
  for (const ReplicaWrite& w : writes) {
    proto->add_variable_ids(w.variable_id);
    proto->add_names(w.name);
    proto->add_versions(w.version);
    proto->add_fences(w.fence);
    proto->add_replica_counts(static_cast<int32_t>(w.replicas.size()));
    proto->mutable_replicas()->Add(w.replicas.begin(), w.replicas.end());
    proto->add_spec_index(specs.IndexOf(w.value->spec));
    proto->add_checksums(w.value->checksum);
    if (shared) {
      int32_t& number = values[w.value.get()];
      const bool first = number == 0;  // its bytes follow
      if (first) number = ++distinct;
      proto->add_value_index(number - 1);
      if (!first) continue;
    }
    data->append(reinterpret_cast<const char*>(w.value->bytes.data()), w.value->bytes.size());
  }
  CountSentTensorBytes(bytes);
}

void InitializerToProto(const Initializer& init, v1::Initializer* proto) {
  using K = InitializerKind;
  switch (init.kind) {
    case K::kNone:
      break;
    case K::kConstant:
      proto->set_constant(init.constant);
      break;
    case K::kZeros:
      proto->set_zeros(true);
      break;
    case K::kOnes:
      proto->set_ones(true);
      break;
    case K::kValue:
      if (init.value) TensorToProto(*init.value, proto->mutable_value());
      break;
    case K::kRandomNormal: {
      auto* r = proto->mutable_random_normal();
      r->set_mean(init.a);
      r->set_stddev(init.b);
      r->set_seed(init.seed);
      r->set_generator(v1::RANDOM_GENERATOR_SPLITMIX64_V1);
      break;
    }
    case K::kRandomUniform: {
      auto* r = proto->mutable_random_uniform();
      r->set_minval(init.a);
      r->set_maxval(init.b);
      r->set_seed(init.seed);
      r->set_generator(v1::RANDOM_GENERATOR_SPLITMIX64_V1);
      break;
    }
  }
}

void VariableDefToProto(const VariableDef& def, v1::VariableSpec* spec) {
  spec->set_name(def.name);
  SpecToProto(def.tensor, spec->mutable_tensor());
  spec->set_trainable(def.trainable);
  for (const auto& c : def.collections) spec->add_collections(c);
  spec->set_replica_count(def.replica_count);
  spec->set_aggregation(static_cast<v1::Aggregation>(def.aggregation));
  spec->set_allow_nonfinite(def.allow_nonfinite);
}

void VariableViewToProto(const VariableView& view, v1::VariableInfo* proto) {
  proto->set_id(view.id);
  VariableDefToProto(view.def, proto->mutable_spec());
  proto->set_version(view.version);
  proto->set_checksum(view.checksum);
  proto->set_initialized(view.initialized);
  proto->set_needs_resync(view.needs_resync);
  for (const auto& c : view.collections) proto->add_collections(c);
  for (const ReplicaView& r : view.replicas) {
    v1::ReplicaInfo* p = proto->add_replicas();
    p->set_index(r.index);
    p->set_name(r.name);
    p->set_device(r.device.ToString());
    p->set_job(r.task.job);
    p->set_task(r.task.task);
    p->set_version(r.version);
    p->set_checksum(r.checksum);
    p->set_state(static_cast<v1::ReplicaState>(r.state));
  }
}

void TopologyToProto(const TopologySnapshot& topo, v1::Topology* proto) {
  proto->set_version(topo.version);
  for (const LiveTask& t : topo.tasks) {
    v1::TaskInfo* p = proto->add_tasks();
    p->set_job(t.key.job);
    p->set_task(t.key.task);
    p->set_address(t.address);
    for (const DeviceName& d : t.devices) p->add_devices(d.ToString());
  }
  for (const Accelerator& a : topo.accelerators) {
    v1::AcceleratorInfo* p = proto->add_accelerators();
    p->set_ordinal(a.ordinal);
    p->set_device(a.device.ToString());
    p->set_job(a.task.job);
    p->set_task(a.task.task);
  }
  if (topo.infeed_host) {
    v1::InfeedHost* p = proto->mutable_infeed_host();
    p->set_job(topo.infeed_host->task.job);
    p->set_task(topo.infeed_host->task.task);
    p->set_address(topo.infeed_host->address);
    p->set_cpu_device(topo.infeed_host->cpu_device);
  }
  for (const auto& m : topo.missing_tasks) proto->add_missing_tasks(m);
}

void CollectiveToProto(const CollectiveSpec& c, v1::Collective* proto) {
  proto->set_group(c.group);
  proto->set_rank(c.rank);
  proto->set_size(c.size);
  proto->set_root(c.root);
  proto->set_tag(c.tag);
  proto->set_timeout_ms(absl::ToInt64Milliseconds(c.timeout));
}

void WriteResultToProto(const WriteResult& r, uint64_t value_bytes_limit,
                        v1::AssignVariableResponse* proto) {
  proto->set_version(r.version);
  proto->set_checksum(r.checksum);
  if (r.value && r.value->bytes.size() <= value_bytes_limit) {
    TensorToProto(*r.value, proto->mutable_value());
  }
}

void StepInfoToProto(const StepInfo& info, v1::StepInfo* proto, bool shared_lists) {
  proto->set_step(info.step);
  proto->set_epoch(info.epoch);
  proto->set_state(static_cast<v1::StepState>(info.state));
  proto->set_barrier_timeout_ms(absl::ToInt64Milliseconds(info.barrier_timeout));
  proto->set_begun_unix_ms(absl::ToUnixMillis(info.begun));
  proto->set_layout_id(info.layout_id);
  proto->set_layout_omitted(info.layout_omitted);
  for (const TaskKey& t : info.sitting_out) {
    v1::StepParticipant* p = proto->add_sitting_out();
    p->set_job(t.job);
    p->set_task(t.task);
  }
  for (const StepParticipant& p : info.participants) {
    v1::StepParticipant* pp = proto->add_participants();
    pp->set_job(p.task.job);
    pp->set_task(p.task.task);
    pp->set_incarnation_digest(IncarnationDigest(p.incarnation));
    pp->set_address(p.address);
  }
  absl::flat_hash_map<const void*, uint32_t> list_of;  // by the shared elements
  for (const StepVariable& v : info.variables) {
    v1::StepVariable* pv = proto->add_variables();
    pv->set_id(v.id);
    pv->set_name(v.name);
    pv->set_aggregation(static_cast<v1::Aggregation>(v.aggregation));
    SpecToProto(v.spec, pv->mutable_spec());
    pv->set_allow_nonfinite(v.allow_nonfinite);
    if (!shared_lists || v.replica_participant.empty()) {
      pv->mutable_replica_participant()->Add(v.replica_participant.begin(),
                                             v.replica_participant.end());
      continue;
    }
    auto [it, fresh] = list_of.try_emplace(v.replica_participant.identity(),
                                           static_cast<uint32_t>(list_of.size() + 1));
    if (fresh) {
      proto->add_participant_lists()->mutable_replica_participant()->Add(
          v.replica_participant.begin(), v.replica_participant.end());
    }
    pv->set_participant_list(it->second);
  }
}

namespace {

void RangesToProto(const IndexRanges& r, google::protobuf::RepeatedField<uint32_t>* proto) {
  proto->Add(r.bounds().begin(), r.bounds().end());
}

template <typename P>
void ShardToProto(const std::vector<VariableChecksum>& shard, P* proto) {
  for (const VariableChecksum& c : shard) {
    v1::VariableChecksum* p = proto->add_shard();
    p->set_variable_id(c.variable_id);
    p->set_checksum(c.checksum);
  }
}

}  // namespace

void ReportToProto(const WorkerReport& report, v1::ReportStepRequest* proto) {
  proto->set_step(report.step);
  proto->set_epoch(report.epoch);
  proto->set_job(report.task.job);
  proto->set_task(report.task.task);
  proto->set_incarnation(report.incarnation);
  RangesToProto(report.changed, proto->mutable_changed_ranges());
  proto->set_digest(report.digest);
  ShardToProto(report.shard, proto);
  proto->set_detailed(report.detailed);
  for (const ReplicaReport& r : report.replicas) {
    v1::ReplicaReport* p = proto->add_replicas();
    p->set_variable_id(r.variable_id);
    p->set_replica(r.replica);
    p->set_checksum(r.checksum);
    p->set_first_nonfinite(r.first_nonfinite);
  }
}

void FinishToProto(const WorkerFinish& finish, v1::FinishStepRequest* proto) {
  proto->set_step(finish.step);
  proto->set_epoch(finish.epoch);
  proto->set_job(finish.task.job);
  proto->set_task(finish.task.task);
  proto->set_incarnation(finish.incarnation);
  proto->set_error(finish.error);
  RangesToProto(finish.held, proto->mutable_held_ranges());
  proto->set_digest(finish.digest);
  ShardToProto(finish.shard, proto);
  for (const PreparedVariable& v : finish.nonfinite) {
    v1::PreparedVariable* p = proto->add_nonfinite();
    p->set_variable_id(v.variable_id);
    p->set_checksum(v.checksum);
    p->set_first_nonfinite(v.first_nonfinite);
    if (v.nonfinite_replica >= 0) p->set_nonfinite_replica(v.nonfinite_replica);
  }
}

void PlanToProto(const StepPlan& plan, v1::StepPlan* proto) {
  proto->set_step(plan.step);
  proto->set_epoch(plan.epoch);
  proto->set_group(plan.group);
  proto->set_timeout_ms(absl::ToInt64Milliseconds(plan.timeout));
  for (const StepCollective& c : plan.collectives) {
    v1::StepCollective* pc = proto->add_collectives();
    pc->set_kind(c.kind == StepCollective::Kind::kAllreduce ? v1::StepCollective::ALLREDUCE
                                                            : v1::StepCollective::BROADCAST);
    pc->set_tag(c.tag);
    RangesToProto(c.variables, pc->mutable_variable_ranges());
    pc->set_root(c.root);
    pc->set_source_replica(c.source_replica);
    pc->set_checksum(c.checksum);
    for (int32_t t : c.targets) pc->add_targets(t);
  }
  RangesToProto(plan.changed, proto->mutable_changed_ranges());
  proto->set_send_detail(plan.send_detail);
}

void StepResolutionToProto(const StepResolution& r, v1::StepResolution* proto, bool short_form) {
  proto->set_step(r.step);
  proto->set_epoch(r.epoch);
  proto->set_state(static_cast<v1::StepState>(r.state));
  proto->set_code(static_cast<int32_t>(r.status.code()));
  proto->set_message(std::string(r.status.message()));
  RangesToProto(r.changed_ranges, proto->mutable_changed_ranges());
  proto->set_changed_digest(r.changed_digest);
  proto->set_layout_id(r.layout_id);
  // A resolution without ranges (one an earlier run committed, answered
  // from its record) goes whole: its list is all there is.
  short_form = short_form && (r.short_form || !r.changed_ranges.empty() || r.changed.empty());
  proto->set_short_form(short_form);
  for (const Divergence& d : r.divergences) {
    v1::Divergence* pd = proto->add_divergences();
    pd->set_variable_id(d.variable_id);
    pd->set_name(d.name);
    for (uint64_t c : d.replica_checksums) pd->add_replica_checksums(c);
    pd->set_chosen_checksum(d.chosen_checksum);
    for (int32_t i : d.repaired) pd->add_repaired(i);
  }
  if (short_form) return;
  for (const auto& [task, latency] : r.latencies) {
    v1::WorkerStepLatency* l = proto->add_latencies();
    l->set_job(task.job);
    l->set_task(task.task);
    l->set_report_ms(absl::ToInt64Milliseconds(latency));
  }
  for (const CommittedVariable& c : r.changed) {
    v1::CommittedVariable* pc = proto->add_changed();
    pc->set_variable_id(c.variable_id);
    pc->set_name(c.name);
    pc->set_version(c.version);
    pc->set_checksum(c.checksum);
  }
}

void StepEventToProto(const StepEvent& e, v1::StepEvent* proto) {
  v1::StepEvent& p = *proto;
  p.set_seq(e.seq);
  p.set_kind(static_cast<v1::StepEvent::Kind>(e.kind));
  p.set_step(e.step);
  p.set_epoch(e.epoch);
  p.set_job(e.task.job);
  p.set_task(e.task.task);
  for (const std::string& m : e.missing) p.add_missing(m);
  if (e.resolution) StepResolutionToProto(*e.resolution, p.mutable_resolution());
  p.set_at_unix_ms(absl::ToUnixMillis(e.at));
}

void StepsStatusToProto(const StepsStatus& st, v1::StepsStatus* resp) {
  if (st.open) StepInfoToProto(*st.open, resp->mutable_open());
  for (const ParticipantProgress& p : st.progress) {
    v1::ParticipantProgress* pp = resp->add_progress();
    pp->set_job(p.task.job);
    pp->set_task(p.task.task);
    pp->set_reported(p.reported);
    pp->set_finished(p.finished);
    pp->set_report_ms(absl::ToInt64Milliseconds(p.report_latency));
    pp->set_last_activity(p.last_activity);
  }
  for (const StepResolution& r : st.recent) StepResolutionToProto(r, resp->add_recent());
  resp->set_last_committed_step(st.last_committed_step);
}

}  // namespace repvar
