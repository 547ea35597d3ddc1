// SPDX-License-Identifier: Apache-2.0
#include "server/store/state_codec.h"

#include <algorithm>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/base/status_util.h"
#include "common/tensor/dtype.h"

namespace repvar::server {
namespace {

absl::Status Bad(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("state on disk: ", what));
}

template <typename E>
absl::StatusOr<E> EnumFrom(int value, int lo, int hi, absl::string_view what) {
  if (value < lo || value > hi) return Bad(absl::StrCat(what, " ", value, " is out of range"));
  return static_cast<E>(value);
}

// ---- Leaves ----

void Put(const TaskKey& k, disk::TaskKey* out) {
  out->set_job(k.job);
  out->set_task(k.task);
}
TaskKey Get(const disk::TaskKey& in) { return TaskKey{in.job(), in.task()}; }

void Put(const DeviceName& d, disk::DeviceName* out) {
  out->set_job(d.job);
  out->set_replica(d.replica);
  out->set_task(d.task);
  out->set_type(d.type);
  out->set_id(d.id);
}
DeviceName Get(const disk::DeviceName& in) {
  return DeviceName{in.job(), in.replica(), in.task(), in.type(), in.id()};
}

void Put(const TensorSpec& s, disk::TensorSpec* out) {
  out->set_dtype(static_cast<int>(s.dtype));
  for (int64_t d : s.dims) out->add_dims(d);
}
absl::StatusOr<TensorSpec> Get(const disk::TensorSpec& in) {
  TensorSpec s;
  auto dtype = DTypeFromInt(in.dtype());
  if (!dtype.ok()) return Bad(absl::StrCat("tensor dtype ", in.dtype(), " is unknown"));
  s.dtype = *dtype;
  s.dims.assign(in.dims().begin(), in.dims().end());
  if (!s.ByteSize().ok()) return Bad(absl::StrCat("tensor spec ", s.ToString(), " is invalid"));
  return s;
}

void Put(const VariableDef& d, disk::VariableDef* out) {
  out->set_name(d.name);
  Put(d.tensor, out->mutable_tensor());
  out->set_trainable(d.trainable);
  for (const std::string& c : d.collections) out->add_collections(c);
  out->set_replica_count(d.replica_count);
  out->set_aggregation(static_cast<int>(d.aggregation));
  out->set_allow_nonfinite(d.allow_nonfinite);
}
absl::StatusOr<VariableDef> Get(const disk::VariableDef& in) {
  VariableDef d;
  d.name = in.name();
  REPVAR_ASSIGN_OR_RETURN(d.tensor, Get(in.tensor()));
  d.trainable = in.trainable();
  d.collections.assign(in.collections().begin(), in.collections().end());
  d.replica_count = in.replica_count();
  if (d.name.empty() || d.replica_count < 1) {
    return Bad(absl::StrCat("variable \"", d.name, "\" with ", d.replica_count, " replicas"));
  }
  REPVAR_ASSIGN_OR_RETURN(d.aggregation,
                          EnumFrom<Aggregation>(in.aggregation(), 1, 4, "aggregation"));
  d.allow_nonfinite = in.allow_nonfinite();
  return d;
}

void Put(const Placement& p, disk::Placement* out) {
  Put(p.device, out->mutable_device());
  Put(p.task, out->mutable_task());
}
Placement Get(const disk::Placement& in) { return Placement{Get(in.device()), Get(in.task())}; }

absl::Status PutTensor(const std::shared_ptr<const Tensor>& t, TensorFiles& files,
                       disk::TensorRef* out) {
  return files.Keep(*t, out);
}

absl::Status Put(const Initializer& i, TensorFiles& files, disk::Initializer* out) {
  out->set_kind(static_cast<int>(i.kind));
  out->set_constant(i.constant);
  out->set_a(i.a);
  out->set_b(i.b);
  out->set_seed(i.seed);
  if (i.value != nullptr) REPVAR_RETURN_IF_ERROR(PutTensor(i.value, files, out->mutable_value()));
  return absl::OkStatus();
}
absl::StatusOr<Initializer> Get(const disk::Initializer& in, TensorFiles& files) {
  Initializer i;
  REPVAR_ASSIGN_OR_RETURN(i.kind, EnumFrom<InitializerKind>(in.kind(), 0, 6, "initializer kind"));
  i.constant = in.constant();
  i.a = in.a();
  i.b = in.b();
  i.seed = in.seed();
  if (in.has_value()) {
    REPVAR_ASSIGN_OR_RETURN(i.value, files.Load(in.value()));
  }
  return i;
}

void Put(const Holder& h, disk::Holder* out) {
  out->set_replica(h.replica);
  out->set_incarnation(h.incarnation);
}
Holder Get(const disk::Holder& in) { return Holder{in.replica(), in.incarnation()}; }

template <typename Repeated>
std::vector<Holder> GetHolders(const Repeated& in) {
  std::vector<Holder> out;
  for (const disk::Holder& h : in) out.push_back(Get(h));
  return out;
}

template <typename Message>
void PutHolders(const Holders& holders, Message* m) {
  for (const Holder& h : holders.listed) Put(h, m->add_holders());
  if (holders.all_but) {
    m->mutable_all_but()->mutable_missing()->Assign(holders.missing.begin(), holders.missing.end());
  }
}

template <typename Message>
absl::StatusOr<Holders> GetHoldersOf(const Message& m) {
  if (!m.has_all_but()) return Holders(GetHolders(m.holders()));
  std::vector<int32_t> missing(m.all_but().missing().begin(), m.all_but().missing().end());
  if (m.holders_size() > 0 || !std::is_sorted(missing.begin(), missing.end())) {
    return absl::DataLossError("a record's holders are listed and all-but at once, or unsorted");
  }
  return Holders::AllBut(std::move(missing));
}

// ---- Answers ----

void Put(const Answer& a, disk::Answer* out) {
  std::visit(
      [out](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::monostate>) {
          out->set_deleted(true);
        } else if constexpr (std::is_same_v<T, CreateAnswer>) {
          auto* c = out->mutable_create();
          for (const std::string& n : x.names) c->add_names(n);
          for (bool b : x.created) c->add_created(b);
          for (const std::string& w : x.warnings) c->add_warnings(w);
        } else if constexpr (std::is_same_v<T, std::vector<InitializeResult>>) {
          auto* init = out->mutable_initialize();
          for (const InitializeResult& r : x) {
            auto* item = init->add_items();
            item->set_name(r.name);
            item->set_initialized_now(r.initialized_now);
            item->set_version(r.version);
            item->set_checksum(r.checksum);
          }
        } else {
          auto* w = out->mutable_write();
          for (const WriteOutcome& o : x) {
            auto* item = w->add_items();
            item->set_version(o.version);
            item->set_checksum(o.checksum);
          }
        }
      },
      a);
}
absl::StatusOr<Answer> Get(const disk::Answer& in) {
  switch (in.kind_case()) {
    case disk::Answer::kDeleted:
      return Answer(std::monostate{});
    case disk::Answer::kCreate: {
      CreateAnswer c;
      c.names.assign(in.create().names().begin(), in.create().names().end());
      c.created.assign(in.create().created().begin(), in.create().created().end());
      c.warnings.assign(in.create().warnings().begin(), in.create().warnings().end());
      return Answer(std::move(c));
    }
    case disk::Answer::kInitialize: {
      std::vector<InitializeResult> r;
      for (const auto& item : in.initialize().items()) {
        r.push_back(
            InitializeResult{item.name(), item.initialized_now(), item.version(), item.checksum()});
      }
      return Answer(std::move(r));
    }
    case disk::Answer::kWrite: {
      std::vector<WriteOutcome> w;
      for (const auto& item : in.write().items()) {
        w.push_back(WriteOutcome{item.version(), item.checksum()});
      }
      return Answer(std::move(w));
    }
    case disk::Answer::KIND_NOT_SET:
      break;
  }
  return Bad("a recorded answer of no kind");
}

// ---- Changes ----

// A request's answer as a record carries it (RequestRecorded, and inside
// WritePrepared): the same row as a checkpointed answer.
void PutRequest(const RequestRecorded& c, disk::RequestRecorded* out) {
  EncodeOutcome(c.key.id, StoredOutcome{c.op, c.key.digest, c.answer, c.at}, out);
}
absl::StatusOr<RequestRecorded> GetRequest(const disk::RequestRecorded& in) {
  REPVAR_ASSIGN_OR_RETURN(auto outcome, DecodeOutcome(in));
  auto& [id, o] = outcome;
  return RequestRecorded{RequestKey{std::move(id), o.digest}, o.op, std::move(o.answer), o.at};
}

// The distinct placements of a record's variables, each spelled out once in
// the record and named by index. Replica i is most often on the i-th
// placement seen, so that one is tried first.
class PlacementTable {
 public:
  explicit PlacementTable(disk::Record* record) : record_(record) {}

  uint32_t Ref(const Placement& p, size_t replica) {
    if (replica < seen_.size() && seen_[replica] == p) return static_cast<uint32_t>(replica);
    for (size_t i = 0; i < seen_.size(); ++i) {
      if (seen_[i] == p) return static_cast<uint32_t>(i);
    }
    seen_.push_back(p);
    Put(p, record_->add_placements());
    return static_cast<uint32_t>(seen_.size() - 1);
  }

 private:
  disk::Record* const record_;
  std::vector<Placement> seen_;
};

struct ChangeEncoder {
  TensorFiles& files;
  disk::Change* out;
  PlacementTable* placements = nullptr;  // null: placements spelled out

  absl::Status operator()(const WorkerRegistered& c) {
    auto* m = out->mutable_worker_registered();
    Put(c.task, m->mutable_task());
    m->set_address(c.address);
    m->set_incarnation(c.incarnation);
    for (const DeviceName& d : c.devices) Put(d, m->add_devices());
    m->set_joining(c.joining);
    return absl::OkStatus();
  }
  absl::Status operator()(const WorkerDied& c) {
    auto* m = out->mutable_worker_died();
    Put(c.task, m->mutable_task());
    m->set_incarnation(c.incarnation);
    return absl::OkStatus();
  }
  absl::Status operator()(const WorkerJoined& c) {
    auto* m = out->mutable_worker_joined();
    Put(c.task, m->mutable_task());
    m->set_incarnation(c.incarnation);
    return absl::OkStatus();
  }
  absl::Status operator()(const VariableCreated& c) {
    auto* m = out->mutable_variable_created();
    m->set_id(c.id);
    Put(c.def, m->mutable_def());
    if (placements != nullptr) {
      m->mutable_placement_refs()->Reserve(static_cast<int>(c.placement.size()));
      for (size_t i = 0; i < c.placement.size(); ++i) {
        m->add_placement_refs(placements->Ref(c.placement[i], i));
      }
    } else {
      for (const Placement& p : c.placement) Put(p, m->add_placement());
    }
    return Put(c.initializer, files, m->mutable_initializer());
  }
  absl::Status operator()(const VariableDeleted& c) {
    out->mutable_variable_deleted()->set_id(c.id);
    return absl::OkStatus();
  }
  absl::Status operator()(const ValueCommitted& c) {
    auto* m = out->mutable_value_committed();
    m->set_id(c.id);
    m->set_version(c.version);
    m->set_checksum(c.checksum);
    PutHolders(c.holders, m);
    if (c.value != nullptr) REPVAR_RETURN_IF_ERROR(PutTensor(c.value, files, m->mutable_value()));
    if (c.initializer) REPVAR_RETURN_IF_ERROR(Put(*c.initializer, files, m->mutable_initializer()));
    return absl::OkStatus();
  }
  absl::Status operator()(const ValueKept& c) {
    auto* m = out->mutable_value_kept();
    m->set_id(c.id);
    m->set_version(c.version);
    m->set_checksum(c.checksum);
    return PutTensor(c.value, files, m->mutable_value());
  }
  absl::Status operator()(const ReplicasWritten& c) {
    auto* m = out->mutable_replicas_written();
    m->set_id(c.id);
    m->set_version(c.version);
    m->set_checksum(c.checksum);
    PutHolders(c.holders, m);
    return absl::OkStatus();
  }
  absl::Status operator()(const ResyncFlagged& c) {
    auto* m = out->mutable_resync_flagged();
    m->set_id(c.id);
    m->set_needs_resync(c.needs_resync);
    return absl::OkStatus();
  }
  absl::Status operator()(const StepBegun& c) {
    out->mutable_step_begun()->set_step(c.step);
    out->mutable_step_begun()->set_epoch(c.epoch);
    return absl::OkStatus();
  }
  absl::Status operator()(const StepCommitted& c) {
    EncodeStepCommitted(c, out->mutable_step_committed());
    return absl::OkStatus();
  }
  absl::Status operator()(const StepFailed& c) {
    out->mutable_step_failed()->set_step(c.step);
    out->mutable_step_failed()->set_epoch(c.epoch);
    return absl::OkStatus();
  }
  absl::Status operator()(const FencesReserved& c) {
    out->mutable_fences_reserved()->set_up_to(c.up_to);
    return absl::OkStatus();
  }
  absl::Status operator()(const RequestRecorded& c) {
    PutRequest(c, out->mutable_request_recorded());
    return absl::OkStatus();
  }
  absl::Status operator()(const WritePrepared& c) {
    auto* m = out->mutable_write_prepared();
    m->set_fence(c.fence);
    for (const PreparedValue& v : c.values) {
      auto* value = m->add_values();
      value->set_id(v.id);
      value->set_version(v.version);
      value->set_checksum(v.checksum);
      REPVAR_RETURN_IF_ERROR(PutTensor(v.value, files, value->mutable_value()));
    }
    PutRequest(c.outcome, m->mutable_outcome());
    return absl::OkStatus();
  }
  absl::Status operator()(const WriteResolved& c) {
    out->mutable_write_resolved()->set_fence(c.fence);
    return absl::OkStatus();
  }
};

absl::StatusOr<Change> DecodeVariableCreated(const disk::VariableCreated& m, TensorFiles& files,
                                             const std::vector<Placement>& placements,
                                             PlacementInterner& interner) {
  VariableCreated c;
  c.id = m.id();
  REPVAR_ASSIGN_OR_RETURN(c.def, Get(m.def()));
  std::vector<Placement> list;
  list.reserve(m.placement_size() + m.placement_refs_size());
  for (const auto& p : m.placement()) list.push_back(Get(p));
  for (uint32_t ref : m.placement_refs()) {
    if (ref >= placements.size()) {
      return Bad(absl::StrCat("variable ", c.def.name, " names placement ", ref, " of ",
                              placements.size()));
    }
    list.push_back(placements[ref]);
  }
  if (list.size() != static_cast<size_t>(c.def.replica_count)) {
    return Bad(absl::StrCat("variable ", c.def.name, " has ", c.def.replica_count, " replicas and ",
                            list.size(), " placements"));
  }
  c.placement = interner.Intern(std::move(list));
  REPVAR_ASSIGN_OR_RETURN(c.initializer, Get(m.initializer(), files));
  return Change(std::move(c));
}

absl::StatusOr<Change> DecodeValueCommitted(const disk::ValueCommitted& m, TensorFiles& files) {
  ValueCommitted c;
  c.id = m.id();
  c.version = m.version();
  c.checksum = m.checksum();
  REPVAR_ASSIGN_OR_RETURN(c.holders, GetHoldersOf(m));
  if (m.has_value()) {
    REPVAR_ASSIGN_OR_RETURN(c.value, files.Load(m.value()));
  }
  if (m.has_initializer()) {
    REPVAR_ASSIGN_OR_RETURN(c.initializer, Get(m.initializer(), files));
  }
  return Change(std::move(c));
}

absl::StatusOr<Change> DecodeWritePrepared(const disk::WritePrepared& m, TensorFiles& files) {
  WritePrepared c;
  c.fence = m.fence();
  for (const auto& v : m.values()) {
    if (!v.has_value()) return absl::DataLossError("a prepared write without its value");
    PreparedValue value{v.id(), v.version(), v.checksum(), nullptr};
    REPVAR_ASSIGN_OR_RETURN(value.value, files.Load(v.value()));
    c.values.push_back(std::move(value));
  }
  REPVAR_ASSIGN_OR_RETURN(c.outcome, GetRequest(m.outcome()));
  return Change(std::move(c));
}

absl::StatusOr<Change> DecodeChange(const disk::Change& in, TensorFiles& files,
                                    const std::vector<Placement>& placements,
                                    PlacementInterner& interner) {
  switch (in.change_case()) {
    case disk::Change::kWorkerRegistered: {
      const auto& m = in.worker_registered();
      WorkerRegistered c{Get(m.task()), m.address(), m.incarnation(), {}, m.joining()};
      for (const auto& d : m.devices()) c.devices.push_back(Get(d));
      return Change(std::move(c));
    }
    case disk::Change::kWorkerDied:
      return Change(WorkerDied{Get(in.worker_died().task()), in.worker_died().incarnation()});
    case disk::Change::kWorkerJoined:
      return Change(WorkerJoined{Get(in.worker_joined().task()), in.worker_joined().incarnation()});
    case disk::Change::kVariableCreated:
      return DecodeVariableCreated(in.variable_created(), files, placements, interner);
    case disk::Change::kVariableDeleted:
      return Change(VariableDeleted{in.variable_deleted().id()});
    case disk::Change::kValueKept: {
      const auto& m = in.value_kept();
      ValueKept c{m.id(), m.version(), m.checksum(), nullptr};
      if (!m.has_value()) return absl::DataLossError("a kept value without its tensor");
      REPVAR_ASSIGN_OR_RETURN(c.value, files.Load(m.value()));
      return Change(std::move(c));
    }
    case disk::Change::kValueCommitted:
      return DecodeValueCommitted(in.value_committed(), files);
    case disk::Change::kReplicasWritten: {
      const auto& m = in.replicas_written();
      REPVAR_ASSIGN_OR_RETURN(Holders holders, GetHoldersOf(m));
      return Change(ReplicasWritten{m.id(), m.version(), m.checksum(), std::move(holders)});
    }
    case disk::Change::kResyncFlagged:
      return Change(ResyncFlagged{in.resync_flagged().id(), in.resync_flagged().needs_resync()});
    case disk::Change::kStepBegun:
      return Change(StepBegun{in.step_begun().step(), in.step_begun().epoch()});
    case disk::Change::kStepCommitted:
      return Change(DecodeStepCommitted(in.step_committed()));
    case disk::Change::kStepFailed:
      return Change(StepFailed{in.step_failed().step(), in.step_failed().epoch()});
    case disk::Change::kRequestRecorded: {
      REPVAR_ASSIGN_OR_RETURN(RequestRecorded c, GetRequest(in.request_recorded()));
      return Change(std::move(c));
    }
    case disk::Change::kFencesReserved:
      return Change(FencesReserved{in.fences_reserved().up_to()});
    case disk::Change::kWritePrepared:
      return DecodeWritePrepared(in.write_prepared(), files);
    case disk::Change::kWriteResolved:
      return Change(WriteResolved{in.write_resolved().fence()});
    case disk::Change::CHANGE_NOT_SET:
      break;
  }
  return Bad("a change of no kind");
}

}  // namespace

void EncodeStepCommitted(const StepCommitted& c, disk::StepCommitted* out) {
  out->set_step(c.step);
  out->set_epoch(c.epoch);
  for (const CommittedVariable& v : c.changed) {
    disk::StepChange* m = out->add_changed();
    m->set_id(v.variable_id);
    m->set_name(v.name);
    m->set_version(v.version);
    m->set_checksum(v.checksum);
  }
}

StepCommitted DecodeStepCommitted(const disk::StepCommitted& in) {
  StepCommitted c{in.step(), in.epoch(), {}};
  for (const disk::StepChange& m : in.changed()) {
    c.changed.push_back(CommittedVariable{m.id(), m.name(), m.version(), m.checksum()});
  }
  return c;
}

absl::Status EncodeRecord(const Record& record, TensorFiles& files, disk::Record* out) {
  PlacementTable placements(out);
  out->mutable_changes()->Reserve(static_cast<int>(record.changes.size()));
  for (const Change& change : record.changes) {
    REPVAR_RETURN_IF_ERROR(
        std::visit(ChangeEncoder{files, out->add_changes(), &placements}, change));
  }
  return absl::OkStatus();
}

absl::StatusOr<Record> DecodeRecord(const disk::Record& in, TensorFiles& files) {
  std::vector<Placement> placements;
  placements.reserve(in.placements_size());
  for (const disk::Placement& p : in.placements()) placements.push_back(Get(p));
  PlacementInterner interner;
  Record record;
  record.changes.reserve(in.changes_size());
  for (const disk::Change& c : in.changes()) {
    REPVAR_ASSIGN_OR_RETURN(Change change, DecodeChange(c, files, placements, interner));
    record.changes.push_back(std::move(change));
  }
  return record;
}

absl::Status EncodeVariable(const VariableRecord& v, TensorFiles& files,
                            disk::VariableRecord* out) {
  out->set_id(v.id);
  Put(v.def, out->mutable_def());
  for (const Placement& p : v.placement) Put(p, out->add_placement());
  REPVAR_RETURN_IF_ERROR(Put(v.initializer, files, out->mutable_initializer()));
  out->set_version(v.version);
  out->set_checksum(v.checksum);
  if (v.value != nullptr) REPVAR_RETURN_IF_ERROR(PutTensor(v.value, files, out->mutable_value()));
  out->set_replicas_are_exceptions(true);
  for (const auto& [i, r] : v.exceptions) {
    auto* m = out->add_replicas();
    m->set_index(i);
    m->set_state(static_cast<int>(r.state));
    m->set_version(r.version);
    m->set_checksum(r.checksum);
    m->set_incarnation(r.incarnation);
  }
  out->set_needs_resync(v.needs_resync);
  return absl::OkStatus();
}

Placements PlacementInterner::Intern(std::vector<Placement> list) {
  for (const Placements& p : distinct_) {
    if (p.list() == list) return p;
  }
  // Past a few hundred distinct lists, sharing stops paying for the search.
  if (distinct_.size() >= 256) return Placements(std::move(list));
  distinct_.emplace_back(std::move(list));
  return distinct_.back();
}

absl::StatusOr<VariableRecord> DecodeVariable(const disk::VariableRecord& in, TensorFiles& files,
                                              PlacementInterner* interner) {
  VariableRecord v;
  v.id = in.id();
  REPVAR_ASSIGN_OR_RETURN(v.def, Get(in.def()));
  std::vector<Placement> list;
  list.reserve(in.placement_size());
  for (const auto& p : in.placement()) list.push_back(Get(p));
  v.placement =
      interner != nullptr ? interner->Intern(std::move(list)) : Placements(std::move(list));
  REPVAR_ASSIGN_OR_RETURN(v.initializer, Get(in.initializer(), files));
  v.version = in.version();
  v.checksum = in.checksum();
  if (in.has_value()) {
    REPVAR_ASSIGN_OR_RETURN(v.value, files.Load(in.value()));
  }
  if (!in.replicas_are_exceptions() && in.replicas_size() != in.placement_size()) {
    return absl::DataLossError(absl::StrCat("variable ", v.def.name, ": ", in.replicas_size(),
                                            " replica records for ", in.placement_size(),
                                            " placements"));
  }
  // Every replica is filed as an exception here; ClusterState::Restore
  // drops those at the norm.
  for (int k = 0; k < in.replicas_size(); ++k) {
    const auto& m = in.replicas(k);
    const int32_t index = in.replicas_are_exceptions() ? m.index() : k;
    if (index < 0 || index >= in.placement_size() || v.exceptions.contains(index)) {
      return absl::DataLossError(absl::StrCat("variable ", v.def.name, ": replica record ", index,
                                              " out of range or listed twice"));
    }
    ReplicaRecord r;
    REPVAR_ASSIGN_OR_RETURN(r.state, EnumFrom<ReplicaState>(m.state(), 1, 4, "replica state"));
    r.version = m.version();
    r.checksum = m.checksum();
    r.incarnation = m.incarnation();
    v.exceptions.emplace(index, r);
  }
  v.needs_resync = in.needs_resync();
  return v;
}

void EncodeWorker(const WorkerRecord& w, disk::WorkerRecord* out) {
  Put(w.task, out->mutable_task());
  out->set_address(w.address);
  out->set_incarnation(w.incarnation);
  for (const DeviceName& d : w.devices) Put(d, out->add_devices());
  out->set_state(w.state == WorkerState::kLive ? 1 : 2);
  out->set_joining(w.joining);
}

absl::StatusOr<WorkerRecord> DecodeWorker(const disk::WorkerRecord& in) {
  WorkerRecord w;
  w.task = Get(in.task());
  w.address = in.address();
  w.incarnation = in.incarnation();
  for (const auto& d : in.devices()) w.devices.push_back(Get(d));
  if (in.state() != 1 && in.state() != 2) {
    return Bad(absl::StrCat("worker ", w.task.ToString(), " in state ", in.state()));
  }
  w.state = in.state() == 1 ? WorkerState::kLive : WorkerState::kDead;
  w.joining = in.joining();
  return w;
}

void EncodeOutcome(const std::string& id, const StoredOutcome& o, disk::RequestRecorded* out) {
  out->set_id(id);
  out->set_digest(o.digest);
  out->set_op(o.op);
  Put(o.answer, out->mutable_answer());
  out->set_at_unix_nanos(absl::ToUnixNanos(o.at));
}

absl::StatusOr<std::pair<std::string, StoredOutcome>> DecodeOutcome(
    const disk::RequestRecorded& in) {
  StoredOutcome o;
  o.op = in.op();
  o.digest = in.digest();
  REPVAR_ASSIGN_OR_RETURN(o.answer, Get(in.answer()));
  o.at = absl::FromUnixNanos(in.at_unix_nanos());
  return std::make_pair(in.id(), std::move(o));
}

}  // namespace repvar::server
