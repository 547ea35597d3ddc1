// SPDX-License-Identifier: Apache-2.0
// Initialize (C5): the first caller wins; each value is made once on the
// coordinator, and variables initialized alike share it. The writes it
// delivers and commits are replication.cc's, its reads are in reads.cc.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/memory_budget.h"
#include "common/base/status_util.h"
#include "common/model/initializer.h"
#include "common/tensor/element_math.h"
#include "server/core/replication.h"
#include "server/core/replication_internal.h"

namespace repvar::server {
namespace {

// What a variable still to be initialized gets its value from.
struct ValueSource {
  Initializer initializer;
  TensorSpec spec;
  bool allow_nonfinite = false;

  bool Alike(const ValueSource& other) const {
    return spec == other.spec && allow_nonfinite == other.allow_nonfinite &&
           SameInitializer(initializer, other.initializer);
  }
};

// The values of one initialize call. Variables initialized alike (the same
// initializer and spec: the zeros of every optimizer slot of a shape) share
// one value, made, charged, checked and sent to each worker once
// (WriteSmallReplicasRequest.value_index); each source is compared with the
// last few made. Values are immutable: a later write to one variable
// replaces its reference, not the shared bytes.
class InitialValues {
 public:
  explicit InitialValues(MemoryBudget* budget) : charge_(budget) {}

  // Errors: RESOURCE_EXHAUSTED (the budget), MakeInitialValue's, and
  // INVALID_ARGUMENT for a non-finite value of a variable that does not opt
  // out; each names `variable`.
  absl::StatusOr<std::shared_ptr<const Tensor>> For(absl::string_view variable,
                                                    const ValueSource& source) {
    for (size_t k = made_.size(); k > 0 && k + kCompared > made_.size(); --k) {
      if (made_[k - 1].first.Alike(source)) return made_[k - 1].second;
    }
    REPVAR_ASSIGN_OR_RETURN(int64_t bytes, source.spec.ByteSize());
    REPVAR_RETURN_IF_ERROR(
        charge_.Add(static_cast<uint64_t>(bytes), absl::StrCat("the initial value of ", variable)));
    auto value = MakeInitialValue(source.initializer, source.spec);
    if (!value.ok()) {
      return absl::Status(value.status().code(),
                          absl::StrCat("variable ", variable, ": ", value.status().message()));
    }
    if (!source.allow_nonfinite) {
      if (int64_t bad = FirstNonFinite(*value); bad >= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("variable ", variable, ": initial value has a non-finite element at ", bad,
                         " (allow_nonfinite is off)"));
      }
    }
    auto shared = std::make_shared<const Tensor>(*std::move(value));
    made_.emplace_back(source, shared);
    return shared;
  }

 private:
  static constexpr size_t kCompared = 4;
  MemoryCharge charge_;  // the values, while they are sent
  std::vector<std::pair<ValueSource, std::shared_ptr<const Tensor>>> made_;
};

}  // namespace

absl::StatusOr<std::vector<InitializeResult>> Replication::Initialize(
    const RequestKey& key, const std::vector<InitializeItem>& items) {
  if (items.empty()) return absl::InvalidArgumentError("initialize needs at least one variable");
  // Every name in one look at the state (one wait for it to be durable).
  REPVAR_ASSIGN_OR_RETURN(
      const std::vector<uint64_t> ids,
      registry_->Read([&](const ClusterState& s) -> absl::StatusOr<std::vector<uint64_t>> {
        std::vector<uint64_t> out;
        out.reserve(items.size());
        for (const InitializeItem& item : items) {
          REPVAR_ASSIGN_OR_RETURN(uint64_t id, IdIn(s, item.name));
          out.push_back(id);
        }
        return out;
      }));
  WriteLocks locks(this, ids);
  REPVAR_ASSIGN_OR_RETURN(std::optional<Answer> cached, registry_->Outcome(key, "initialize"));
  if (cached) return std::get<std::vector<InitializeResult>>(*cached);

  // Who still needs a value, with which initializer (the first caller wins).
  struct Todo {
    std::string name;
    ValueSource source;
  };
  REPVAR_ASSIGN_OR_RETURN(
      auto todo,
      registry_->Read([&](const ClusterState& state) -> absl::StatusOr<std::map<uint64_t, Todo>> {
        std::map<uint64_t, Todo> out;
        for (size_t i = 0; i < items.size(); ++i) {
          const VariableRecord* v = state.FindId(ids[i]);
          if (v == nullptr) {
            return absl::NotFoundError(
                absl::StrCat("variable \"", items[i].name, "\" was deleted"));
          }
          if (v->version > 0 || out.contains(v->id)) continue;
          out[v->id] = Todo{v->def.name,
                            {items[i].initializer.value_or(v->initializer), v->def.tensor,
                             v->def.allow_nonfinite}};
        }
        return out;
      }));
  std::vector<PlannedWrite> writes;
  std::map<uint64_t, Initializer> initializers;  // those given with this call
  std::vector<bool> now(items.size(), false);    // this call initializes item i
  InitialValues values(budget_);
  for (size_t i = 0; i < items.size(); ++i) {
    auto t = todo.find(ids[i]);
    if (t == todo.end()) continue;  // initialized already, or earlier in this batch
    REPVAR_ASSIGN_OR_RETURN(std::shared_ptr<const Tensor> value,
                            values.For(items[i].name, t->second.source));
    if (items[i].initializer) initializers[ids[i]] = *items[i].initializer;
    writes.push_back(PlannedWrite{ids[i], t->second.name, 1, std::move(value)});
    now[i] = true;
    todo.erase(t);
  }
  REPVAR_ASSIGN_OR_RETURN(const Delivery delivery, Deliver(writes));
  // The answer, as it is once the writes commit.
  std::map<uint64_t, const PlannedWrite*> planned;
  for (const PlannedWrite& w : writes) planned[w.id] = &w;
  std::vector<InitializeResult> results;
  REPVAR_RETURN_IF_ERROR(registry_->Read([&](const ClusterState& state) -> absl::Status {
    for (size_t i = 0; i < items.size(); ++i) {
      if (auto w = planned.find(ids[i]); w != planned.end()) {
        results.push_back(InitializeResult{items[i].name, now[i], w->second->version,
                                           w->second->value->checksum});
        continue;
      }
      const VariableRecord* v = state.FindId(ids[i]);
      if (v == nullptr) return VariableNotFound(items[i].name);
      results.push_back(InitializeResult{items[i].name, false, v->version, v->checksum});
    }
    return absl::OkStatus();
  }));
  REPVAR_RETURN_IF_ERROR(CommitWrites(writes, delivery, initializers,
                                      RequestRecorded{key, "initialize", results, clock_->Now()}));
  return results;
}

}  // namespace repvar::server
