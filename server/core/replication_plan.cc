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
  // Each placement list's groups, by its index in `lists`.
  std::vector<std::vector<Group>> lists;
  absl::flat_hash_map<const std::vector<Placement>*, size_t> per_list;
  // Phase 1: each write's groups, and so each batch's size.
  constexpr size_t kNone = ~size_t{0};
  std::vector<size_t> list_of(writes.size(), kNone);
  absl::flat_hash_map<WriteBatch*, size_t> sizes;
  for (size_t k = 0; k < writes.size(); ++k) {
    const VariableRecord* v = state.FindId(writes[k].id);
    if (v == nullptr) continue;
    auto [where, fresh] = per_list.try_emplace(&v->placement.list(), lists.size());
    if (fresh) {
      std::map<TaskKey, std::vector<int32_t>> replicas;
      for (size_t i = 0; i < v->placement.size(); ++i) {
        if (state.LiveWorker(v->placement[i].task) != nullptr) {
          replicas[v->placement[i].task].push_back(static_cast<int32_t>(i));
        }
      }
      std::vector<Group>& groups = lists.emplace_back();
      for (auto& [task, idx] : replicas) {
        WriteBatch& b = per_task[task];
        const WorkerRecord& worker = *state.Worker(task);
        b.target = WorkerTarget{task, worker.address, worker.incarnation};
        groups.push_back(Group{&b, std::move(idx)});
      }
    }
    list_of[k] = where->second;
    for (const Group& g : lists[where->second]) ++sizes[g.batch];
  }
  // Phase 2: the batches, each allocated once.
  for (auto& [batch, size] : sizes) batch->writes.reserve(size);
  for (size_t k = 0; k < writes.size(); ++k) {
    if (list_of[k] == kNone) continue;
    const PlannedWrite& w = writes[k];
    for (const Group& g : lists[list_of[k]]) {
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
    if (statuses[i].ok()) {
      d.acknowledged[t.task] = t.incarnation;
    } else {
      d.unanswered[t.task] = t.incarnation;
      d.failures.push_back(absl::StrCat(t.task.ToString(), ": ", statuses[i].ToString()));
    }
  }
  return d;
}

namespace {

// Whether each replica of `v` is on a worker of `answered` still live under
// the incarnation that answered. A worker's replicas are adjacent in a
// placement, so each worker is looked up once per run of them.
template <typename Fn>
void ForEachReplica(const ClusterState& state, const VariableRecord& v,
                    const absl::flat_hash_map<TaskKey, uint64_t>& answered, Fn fn) {
  const TaskKey* last_task = nullptr;
  bool last_live = false;
  uint64_t last_incarnation = 0;
  for (size_t i = 0; i < v.replica_count(); ++i) {
    const TaskKey& task = v.placement[i].task;
    if (last_task == nullptr || task != *last_task) {
      last_task = &task;
      auto it = answered.find(task);
      last_live = it != answered.end() && state.IsLive(task, it->second);
      last_incarnation = it == answered.end() ? 0 : it->second;
    }
    fn(static_cast<int32_t>(i), last_live, last_incarnation);
  }
}

}  // namespace

std::vector<Holder> LiveHolders(const ClusterState& state, const VariableRecord& v,
                                const absl::flat_hash_map<TaskKey, uint64_t>& answered) {
  std::vector<Holder> out;
  ForEachReplica(state, v, answered, [&](int32_t replica, bool live, uint64_t incarnation) {
    if (live) out.push_back(Holder{replica, incarnation});
  });
  return out;
}

std::vector<Holder> LiveHolders(const ClusterState& state, const VariableRecord& v,
                                const std::vector<Holder>& holders) {
  std::vector<Holder> out;
  for (const Holder& h : holders) {
    if (state.IsLive(v.placement[h.replica].task, h.incarnation)) out.push_back(h);
  }
  return out;
}

std::vector<int32_t> NotLiveHolders(const ClusterState& state, const VariableRecord& v,
                                    const absl::flat_hash_map<TaskKey, uint64_t>& acknowledged) {
  std::vector<int32_t> missing;
  ForEachReplica(state, v, acknowledged, [&](int32_t replica, bool live, uint64_t) {
    if (!live) missing.push_back(replica);
  });
  return missing;
}

namespace {

// A write that did not reach every live replica: the replicas that got it
// now hold an uncommitted version and are STALE, not silently ahead; those
// that did not answer may hold either value (the answer may be what was
// lost), so they are STALE too until repair rewrites them with a higher
// fence and checks what they hold.
void SettleUndelivered(const ClusterState& state, const VariableRecord& v, const PlannedWrite& w,
                       const Delivery& delivery, Record& record) {
  std::vector<Holder> holders = LiveHolders(state, v, delivery.acknowledged);
  if (!holders.empty()) {
    record.changes.push_back(
        ReplicasWritten{w.id, w.version, w.value->checksum, std::move(holders)});
  }
  if (v.version > 0) {
    std::vector<Holder> unknown = LiveHolders(state, v, delivery.unanswered);
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
  // Variables created together share a placement list, and so the replicas
  // that missed the write: worked out once per list.
  absl::flat_hash_map<const std::vector<Placement>*, std::vector<int32_t>> missing_per_list;
  for (const PlannedWrite& w : writes) {
    const VariableRecord* v = state.FindId(w.id);
    if (v == nullptr) continue;
    if (!delivered) {
      SettleUndelivered(state, *v, w, delivery, record);
      continue;
    }
    auto [missing, fresh] = missing_per_list.try_emplace(&v->placement.list());
    if (fresh) missing->second = NotLiveHolders(state, *v, delivery.acknowledged);
    auto init = initializers.find(w.id);
    record.changes.push_back(ValueCommitted{
        w.id, w.version, w.value->checksum, w.value, Holders::AllBut(missing->second),
        init == initializers.end() ? std::nullopt : std::optional<Initializer>(init->second)});
    if (v->needs_resync) record.changes.push_back(ResyncFlagged{w.id, false});
  }
  if (delivered && outcome) record.changes.push_back(*outcome);
  if (delivery.prepared != 0) record.changes.push_back(WriteResolved{delivery.prepared});
  return record;
}

}  // namespace repvar::server
