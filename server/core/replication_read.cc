// SPDX-License-Identifier: Apache-2.0
// Reads (C1): the committed value of a variable, from the coordinator's
// copy (checked at its first use when it lives in a blob file) or from an
// up-to-date replica when a step changed it, and the bounded cache of what
// was read back. The writes of Replication are in replication.cc (initialize
// in initialize.cc), repair in repair.cc.
#include "absl/strings/str_cat.h"
#include "common/base/status_util.h"
#include "server/core/replication.h"
#include "server/core/replication_internal.h"
#include "spdlog/spdlog.h"

namespace repvar::server {
namespace {

absl::Status Uninitialized(absl::string_view name) {
  return absl::FailedPreconditionError(
      absl::StrCat("variable ", name, " is uninitialized; initialize or assign it first"));
}

}  // namespace

// ---- Reads ----

absl::StatusOr<ReadResult> Replication::Read(absl::string_view name) {
  REPVAR_ASSIGN_OR_RETURN(uint64_t id, IdOf(name));
  return CommittedValue(id);
}

absl::StatusOr<std::vector<ReadResult>> Replication::ReadBatch(
    absl::Span<const absl::string_view> names, uint64_t max_bytes) {
  std::vector<ReadResult> out;
  REPVAR_RETURN_IF_ERROR(ReadBatchFrom(names, max_bytes, std::nullopt, &out).status());
  return out;  // without a bound on what is held, every value is read
}

absl::StatusOr<std::optional<std::vector<ReadResult>>> Replication::ReadBatchHeld(
    absl::Span<const absl::string_view> names, uint64_t max_bytes, uint64_t held_bytes) {
  std::vector<ReadResult> out;
  REPVAR_ASSIGN_OR_RETURN(bool whole, ReadBatchFrom(names, max_bytes, held_bytes, &out));
  if (!whole) return std::nullopt;
  return out;
}

absl::StatusOr<bool> Replication::ReadBatchFrom(absl::Span<const absl::string_view> names,
                                                uint64_t max_bytes,
                                                std::optional<uint64_t> held_bytes,
                                                std::vector<ReadResult>* read) {
  const bool fetch = !held_bytes.has_value();
  std::vector<ReadResult>& out = *read;
  out.resize(names.size());
  std::vector<uint64_t> ids(names.size());
  std::vector<int64_t> versions(names.size());
  uint64_t total = 0;
  auto look = [&](const ClusterState& state) -> absl::Status {
    total = 0;
    for (size_t i = 0; i < names.size(); ++i) {
      const VariableRecord* v = state.Find(names[i]);
      if (v == nullptr) return VariableNotFound(names[i]);
      if (v->version == 0) return Uninitialized(v->def.name);
      REPVAR_ASSIGN_OR_RETURN(int64_t bytes, v->def.tensor.ByteSize());
      total += static_cast<uint64_t>(bytes);
      if (total > max_bytes) {
        return absl::ResourceExhaustedError(
            absl::StrCat("a batched read of more than ", max_bytes, " bytes (", names[i],
                         " takes it past); read large variables one at a time"));
      }
      ids[i] = v->id;
      versions[i] = v->version;
      if (v->value != nullptr) out[i] = ReadResult{v->version, v->value};
    }
    return absl::OkStatus();
  };
  if (fetch) {
    REPVAR_RETURN_IF_ERROR(registry_->Read(look));
  } else {
    // Not a state a sync has yet to make durable: that is a wait.
    std::optional<absl::Status> looked = registry_->ReadIfDurable(look);
    if (!looked) return false;
    REPVAR_RETURN_IF_ERROR(*looked);
    if (total > *held_bytes) return false;
  }
  for (size_t i = 0; i < out.size(); ++i) {
    // A copy in a blob file is checked at its first use (a pass over its
    // bytes, from disk after a restart: not where a read must not wait); a
    // damaged one, and a value a step left on the replicas, are read as Read
    // reads them.
    if (const Tensor* kept = out[i].value.get()) {
      const std::optional<absl::Status> checked =
          fetch ? log_->Check(*kept) : log_->CheckIfKnown(*kept);
      if (checked && checked->ok()) continue;
    } else if (std::optional<ReadResult> cached = Cached(ids[i], versions[i])) {
      out[i] = *std::move(cached);
      continue;
    }
    if (!fetch) return false;
    REPVAR_ASSIGN_OR_RETURN(out[i], CommittedValue(ids[i]));
  }
  return true;
}

std::optional<ReadResult> Replication::Cached(uint64_t id, int64_t version) {
  RankedLock lock(&mu_);
  auto it = fetched_.find(id);
  if (it == fetched_.end() || it->second.version != version) return std::nullopt;
  return it->second;
}

absl::StatusOr<ReadResult> Replication::CommittedValue(uint64_t id) {
  struct Source {
    int32_t replica;
    WorkerTarget target;
  };
  int64_t version = 0;
  uint64_t checksum = 0;
  std::string name;
  std::vector<Source> sources;  // up-to-date replicas, primary first
  std::optional<ReadResult> kept;
  REPVAR_RETURN_IF_ERROR(registry_->Read([&](const ClusterState& state) -> absl::Status {
    const VariableRecord* v = state.FindId(id);
    if (v == nullptr)
      return absl::NotFoundError(absl::StrCat("variable id ", id, " does not exist"));
    if (v->version == 0) return Uninitialized(v->def.name);
    version = v->version;
    checksum = v->checksum;
    name = v->def.name;
    if (v->value != nullptr) kept = ReadResult{v->version, v->value};
    for (size_t i = 0; i < v->placement.size(); ++i) {
      if (v->StateOf(i) != ReplicaState::kUpToDate) continue;
      const WorkerRecord& w = *state.Worker(v->placement[i].task);
      sources.push_back(Source{static_cast<int32_t>(i), {w.task, w.address, w.incarnation}});
    }
    return absl::OkStatus();
  }));
  if (kept) {
    // Kept in a file: its bytes are checked at their first use. A damaged
    // copy is never served; the replicas still hold the value.
    absl::Status s = log_->Check(*kept->value);
    if (s.ok()) return *kept;
    spdlog::error(
        "variable {}: the coordinator's copy of version {} is damaged ({}); reading it "
        "from a replica",
        name, version, s.ToString());
  }
  if (std::optional<ReadResult> cached = Cached(id, version)) return *std::move(cached);
  std::string last_error = "no up-to-date replica is live";
  for (const Source& source : sources) {
    absl::StatusOr<WorkerClient::ReplicaValue> got;
    CallGroup call(1);
    workers_->ReadReplicaAsync(
        source.target, id, source.replica, version,
        [&got, done = call.Callback(0)](absl::StatusOr<WorkerClient::ReplicaValue> r) mutable {
          got = std::move(r);
          std::move(done)(absl::OkStatus());
        });
    call.Wait();
    if (!got.ok()) {
      last_error = absl::StrCat(source.target.task.ToString(), ": ", got.status().ToString());
      continue;
    }
    if (got->version != version || got->value->checksum != checksum) {
      last_error = absl::StrCat(source.target.task.ToString(), " holds version ", got->version);
      continue;
    }
    ReadResult r{version, got->value};
    Cache(id, r);
    return r;
  }
  return absl::UnavailableError(
      absl::StrCat("variable ", name, ": no up-to-date replica could be read (", last_error, ")"));
}

void Replication::Cache(uint64_t id, std::optional<ReadResult> value) {
  RankedLock lock(&mu_);
  if (auto it = fetched_.find(id); it != fetched_.end()) {
    fetched_bytes_ -= it->second.value->bytes.size();
    fetched_.erase(it);
  }
  if (!value || value->value->bytes.size() > options_.read_cache_bytes / 4) return;
  // Room by evicting whatever comes first: any entry is as good as another
  // for a cache this is (reads of step-changed variables).
  while (!fetched_.empty() &&
         fetched_bytes_ + value->value->bytes.size() > options_.read_cache_bytes) {
    fetched_bytes_ -= fetched_.begin()->second.value->bytes.size();
    fetched_.erase(fetched_.begin());
  }
  fetched_bytes_ += value->value->bytes.size();
  fetched_.emplace(id, *std::move(value));
}

uint64_t Replication::cached_bytes() {
  RankedLock lock(&mu_);
  return fetched_bytes_;
}

}  // namespace repvar::server
