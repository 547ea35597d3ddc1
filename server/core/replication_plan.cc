// SPDX-License-Identifier: Apache-2.0
#include "server/core/replication_plan.h"

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace repvar::server {

std::vector<WriteBatch> GroupByWorker(const ClusterState& state,
                                      const std::vector<PlannedWrite>& writes, uint64_t fence) {
  std::map<TaskKey, WriteBatch> per_task;
  // The replicas on each live worker, per placement list.
  struct Group {
    WriteBatch* batch;
    std::vector<int32_t> replicas;
  };
  absl::flat_hash_map<const std::vector<Placement>*, std::vector<Group>> per_list;
  for (const PlannedWrite& w : writes) {
    const VariableRecord* v = state.FindId(w.id);
    if (v == nullptr) continue;
    auto [where, fresh] = per_list.try_emplace(&v->placement.list());
    std::vector<Group>& groups = where->second;
    if (fresh) {
      std::map<TaskKey, std::vector<int32_t>> replicas;
      for (size_t i = 0; i < v->placement.size(); ++i) {
        if (state.LiveWorker(v->placement[i].task) != nullptr) {
          replicas[v->placement[i].task].push_back(static_cast<int32_t>(i));
        }
      }
      for (auto& [task, idx] : replicas) {
        WriteBatch& b = per_task[task];
        const WorkerRecord& worker = *state.Worker(task);
        b.target = WorkerTarget{task, worker.address, worker.incarnation};
        groups.push_back(Group{&b, std::move(idx)});
      }
    }
    for (const Group& g : groups) {
      g.batch->writes.push_back(ReplicaWrite{w.id, w.name, w.version, g.replicas, w.value, fence});
    }
  }
  std::vector<WriteBatch> out;
  out.reserve(per_task.size());
  for (auto& [task, b] : per_task) out.push_back(std::move(b));
  return out;
}

Delivery FoldAnswers(const std::vector<WriteBatch>& batches,
                     const std::vector<absl::Status>& statuses,
                     const absl::Status& prepared_durable, uint64_t prepared) {
  Delivery d;
  d.prepared = prepared;
  if (!prepared_durable.ok()) {
    d.failures.push_back(absl::StrCat("state log: ", prepared_durable.ToString()));
  }
  for (size_t i = 0; i < batches.size(); ++i) {
    const WorkerTarget& t = batches[i].target;
    // A worker that did not answer may hold the new version, the old one
    // or neither.
    auto& into = statuses[i].ok() ? d.holders : d.unknown;
    if (!statuses[i].ok()) {
      d.failures.push_back(absl::StrCat(t.task.ToString(), ": ", statuses[i].ToString()));
    }
    for (const ReplicaWrite& w : batches[i].writes) {
      for (int32_t r : w.replicas) into[w.variable_id].push_back(Holder{r, t.incarnation});
    }
  }
  return d;
}

std::vector<Holder> LiveHolders(const ClusterState& state, const VariableRecord& v,
                                const std::vector<Holder>& holders) {
  std::vector<Holder> out;
  for (const Holder& h : holders) {
    if (state.IsLive(v.placement[h.replica].task, h.incarnation)) out.push_back(h);
  }
  return out;
}

Holders LiveHoldersAllBut(const ClusterState& state, const VariableRecord& v,
                          const std::vector<Holder>& holders) {
  std::vector<bool> held(v.replica_count(), false);
  // A worker's replicas come together: its liveness is looked up once.
  const TaskKey* last_task = nullptr;
  uint64_t last_incarnation = 0;
  bool last_live = false;
  for (const Holder& h : holders) {
    const TaskKey& task = v.placement[h.replica].task;
    if (&task != last_task || h.incarnation != last_incarnation) {
      last_task = &task;
      last_incarnation = h.incarnation;
      last_live = state.IsLive(task, h.incarnation);
    }
    if (last_live) held[static_cast<size_t>(h.replica)] = true;
  }
  std::vector<int32_t> missing;
  for (size_t i = 0; i < held.size(); ++i) {
    if (!held[i]) missing.push_back(static_cast<int32_t>(i));
  }
  return Holders::AllBut(std::move(missing));
}

namespace {

const std::vector<Holder>& Of(const std::map<uint64_t, std::vector<Holder>>& by_id, uint64_t id) {
  static const std::vector<Holder> kNone;
  auto it = by_id.find(id);
  return it == by_id.end() ? kNone : it->second;
}

// A write that did not reach every live replica: the replicas that got it
// now hold an uncommitted version and are STALE, not silently ahead; those
// that did not answer may hold either value (the answer may be what was
// lost), so they are STALE too until repair rewrites them with a higher
// fence and checks what they hold.
void SettleUndelivered(const ClusterState& state, const VariableRecord& v, const PlannedWrite& w,
                       const Delivery& delivery, Record& record) {
  std::vector<Holder> holders = LiveHolders(state, v, Of(delivery.holders, w.id));
  if (!holders.empty()) {
    record.changes.push_back(
        ReplicasWritten{w.id, w.version, w.value->checksum, std::move(holders)});
  }
  if (v.version > 0) {
    std::vector<Holder> unknown = LiveHolders(state, v, Of(delivery.unknown, w.id));
    if (!unknown.empty()) record.changes.push_back(ReplicasWritten{w.id, 0, 0, std::move(unknown)});
  }
  record.changes.push_back(ResyncFlagged{w.id, true});
}

}  // namespace

Record SettleWrites(const ClusterState& state, const std::vector<PlannedWrite>& writes,
                    const Delivery& delivery, const std::map<uint64_t, Initializer>& initializers,
                    const std::optional<RequestRecorded>& outcome) {
  const bool delivered = delivery.failures.empty();
  Record record;
  for (const PlannedWrite& w : writes) {
    const VariableRecord* v = state.FindId(w.id);
    if (v == nullptr) continue;
    if (!delivered) {
      SettleUndelivered(state, *v, w, delivery, record);
      continue;
    }
    auto init = initializers.find(w.id);
    record.changes.push_back(ValueCommitted{
        w.id, w.version, w.value->checksum, w.value,
        LiveHoldersAllBut(state, *v, Of(delivery.holders, w.id)),
        init == initializers.end() ? std::nullopt : std::optional<Initializer>(init->second)});
    if (v->needs_resync) record.changes.push_back(ResyncFlagged{w.id, false});
  }
  if (delivered && outcome) record.changes.push_back(*outcome);
  if (delivery.prepared != 0) record.changes.push_back(WriteResolved{delivery.prepared});
  return record;
}

}  // namespace repvar::server
