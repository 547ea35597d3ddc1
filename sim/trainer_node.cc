// SPDX-License-Identifier: Apache-2.0
#include "sim/trainer_node.h"

#include <cmath>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/core/coordinator.h"
#include "sim/coordinator_node.h"
#include "sim/worker_node.h"
#include "sim/world.h"

namespace repvar::sim {
namespace {

constexpr absl::Duration kBarrierTimeout = absl::Seconds(3);
// A trainer's commit waits out the barrier, the aggregation (its timeout is
// 30 s and up) and the worker's asking again after a lost answer.
constexpr absl::Duration kCommitWait = absl::Minutes(3);

std::shared_ptr<const Tensor> FloatTensor(const std::vector<float>& v) {
  TensorSpec spec{DType::kFloat32, {static_cast<int64_t>(v.size())}};
  auto t = Tensor::FromBytes(
      spec, {reinterpret_cast<const std::byte*>(v.data()), v.size() * sizeof(float)});
  return std::make_shared<const Tensor>(*std::move(t));
}

// One replica's write in a step: the host (participant) that makes it.
struct PlannedWrite {
  size_t host;
  worker::StepTable::WriteItem item;
};

using Heard = TrainerNode::Heard;

std::vector<PlannedWrite> PlanWrites(World* w, const StepInfo& step) {
  // What every replica writes, decided here (the driver's picks).
  Random& random = w->random();
  const StepInfo* info = &step;
  std::vector<PlannedWrite> writes;
  const bool diverge = random.Uniform(4) == 0;
  const bool nonfinite = random.Uniform(12) == 0;
  for (const StepVariable& v : info->variables) {
    if (v.name.rfind("s", 0) != 0) continue;  // the clients' variables stay out of steps
    const float agreed = static_cast<float>(random.Between(-8, 8));
    // NONE: the replica that writes another value, or every replica of one
    // host (its summary then agrees with itself: only the digests show it).
    int32_t odd = -1, odd_host = -1;
    if (v.aggregation == Aggregation::kNone && diverge) {
      odd = static_cast<int32_t>(random.Uniform(v.replica_participant.size()));
      if (random.Uniform(2) == 0) std::swap(odd, odd_host);
      if (odd_host >= 0) odd_host = v.replica_participant[static_cast<size_t>(odd_host)];
    }
    for (size_t r = 0; r < v.replica_participant.size(); ++r) {
      const int32_t p = v.replica_participant[r];
      if (p < 0 || random.Uniform(8) == 0) continue;  // sitting out, or not written
      const bool odd_one = static_cast<int32_t>(r) == odd || p == odd_host;
      float x = v.aggregation == Aggregation::kNone && !odd_one
                    ? agreed
                    : static_cast<float>(random.Between(-8, 8));
      if (nonfinite && v.aggregation == Aggregation::kNone && r == 0) {
        x = std::numeric_limits<float>::quiet_NaN();
      }
      writes.push_back(
          {static_cast<size_t>(p), {v.id, static_cast<int32_t>(r), FloatTensor({x, x + 1})}});
    }
  }
  return writes;
}

// Starts each host's trainer (in its worker's process) and waits until
// every one heard, or the hosts of those that did not died.
std::vector<Heard> RunTrainers(World* w, const std::shared_ptr<const StepInfo>& info,
                               const std::vector<PlannedWrite>& writes) {
  Scheduler& s = w->scheduler();
  const int64_t hosts = static_cast<int64_t>(info->participants.size());
  auto heard = std::make_shared<std::vector<Heard>>(static_cast<size_t>(hosts));
  auto running = std::make_shared<int>(0);
  for (int64_t h = 0; h < hosts; ++h) {
    WorkerNode* node = w->WorkerAt(w->NodeOfTask(info->participants[h].task));
    if (node == nullptr || !node->up() ||
        node->incarnation() != info->participants[h].incarnation) {
      continue;  // that host's process is gone: its trainer with it
    }
    std::vector<worker::StepTable::WriteItem> mine;
    for (const PlannedWrite& x : writes) {
      if (x.host == static_cast<size_t>(h)) mine.push_back(x.item);
    }
    ++*running;
    worker::StepTable* table = node->steps();
    s.Spawn(node->process(), absl::StrCat("trainer ", h),
            [table, info, mine = std::move(mine), heard, running, h, &s]() mutable {
              table->Hint(info->step, info->epoch, info->layout_id, info->barrier_timeout);
              absl::Status wrote =
                  mine.empty() ? absl::OkStatus() : table->Write(info->step, info->epoch, mine);
              Heard& me = (*heard)[static_cast<size_t>(h)];
              if (wrote.ok()) {
                me.result = table->Commit(info->step, info->epoch, {}, s.Now() + kCommitWait);
              } else {
                me.result = wrote;
                table->Discard(info->epoch);
              }
              me.answered = true;
              me.answered_us = absl::ToUnixMicros(s.Now());
              --*running;
            });
  }
  // Until every trainer heard, or the hosts of those that did not died.
  const absl::Time give_up = s.Now() + kCommitWait + absl::Seconds(10);
  while (*running > 0 && s.Now() < give_up) s.clock()->SleepFor(absl::Milliseconds(20));
  return *heard;
}

}  // namespace

void TrainerNode::StartWorkload(int steps) {
  done_ = false;
  if (process_ < 0) process_ = world_->network().Start(node_, "trainers");
  world_->scheduler().Spawn(process_, "trainer driver", [this, steps] {
    Workload(steps);
    done_ = true;
  });
}

void TrainerNode::Workload(int steps) {
  for (const auto& [id, v] : world_->mirror().variables()) {
    if (v.def.name.rfind("s", 0) == 0) versions_[v.def.name] = v.version;
  }
  int64_t step = last_committed_ + 1;
  for (int i = 0; i < steps; ++i) {
    if (RunStep(step)) ++step;
    world_->scheduler().clock()->SleepFor(
        world_->random().Between(absl::ZeroDuration(), absl::Milliseconds(300)));
  }
}

bool TrainerNode::RunStep(int64_t step) {
  World* w = world_;
  Scheduler& s = w->scheduler();
  auto begun = w->network().CallAndWait<server::SharedStep>(
      World::kCoordinatorNode, s.Now() + absl::Seconds(10), "BeginStep",
      [w, step](ProcessId callee, Network::Answer<server::SharedStep> answer) {
        auto core = w->coordinator().Serving(callee);
        if (!core.ok()) return answer(core.status());
        answer((*core)->BeginStep(step, kBarrierTimeout));
      });
  if (!begun.ok()) {
    w->Log(absl::StrCat("trainers: begin step ", step, " -> ", begun.status().ToString()));
    if (absl::IsFailedPrecondition(begun.status()) &&
        begun.status().message().find("is open") != std::string::npos) {
      // An earlier step of ours is still open (its trainers gave up): abort it.
      (void)w->network().CallAndWait<Nothing>(
          World::kCoordinatorNode, s.Now() + absl::Seconds(10), "GetSteps",
          [w](ProcessId callee, Network::Answer<Nothing> answer) {
            auto core = w->coordinator().Serving(callee);
            if (!core.ok()) return answer(core.status());
            StepsStatus st = (*core)->GetSteps();
            if (st.open) (void)(*core)->AbortStep(st.open->epoch, "the trainers gave up");
            answer(Nothing{});
          });
    }
    return false;
  }
  const std::shared_ptr<const StepInfo> info = begun->info;
  const std::vector<Heard> heard = RunTrainers(world_, info, PlanWrites(world_, *info));
  return CheckOutcome(step, *info, heard);
}

bool TrainerNode::CheckOutcome(int64_t step, const StepInfo& step_info,
                               const std::vector<Heard>& heard_list) {
  World* w = world_;
  const StepInfo* info = &step_info;
  const std::vector<Heard>* heard = &heard_list;
  const int64_t hosts = static_cast<int64_t>(info->participants.size());
  // S4: the trainers that heard the coordinator's outcome heard the same.
  std::vector<std::string> outcomes;
  const StepResolution* committed = nullptr;
  bool failed = false;
  for (int64_t h = 0; h < hosts; ++h) {
    const Heard& x = (*heard)[static_cast<size_t>(h)];
    if (!x.answered) {
      outcomes.push_back("-");
      continue;
    }
    if (!x.result.ok()) {
      outcomes.push_back(absl::StrCat("error ", x.result.status().code()));
      continue;
    }
    if (x.result->state == StepState::kCommitted) {
      outcomes.push_back(absl::StrCat("committed ", x.result->changed.size()));
      if (committed == nullptr) committed = &*x.result;
    } else {
      outcomes.push_back(absl::StrCat("failed ", x.result->status.code()));
      failed = true;
    }
  }
  w->Log(absl::StrCat("trainers: step ", step, " epoch ", info->epoch, ": ",
                      absl::StrJoin(outcomes, ", ")));
  if (committed == nullptr) return false;
  if (failed) {
    w->Fail("S4 one resolution",
            absl::StrCat("step ", step, " (epoch ", info->epoch,
                         "): some trainers heard it committed, others failed: ",
                         absl::StrJoin(outcomes, ", ")));
  }
  if (step <= last_committed_) {
    w->Fail("S1 committed steps increase",
            absl::StrCat("step ", step, " committed after step ", last_committed_));
  }
  last_committed_ = step;
  for (int64_t h = 0; h < hosts; ++h) {
    const Heard& x = (*heard)[static_cast<size_t>(h)];
    if (!x.answered || !x.result.ok() || x.result->state != StepState::kCommitted) continue;
    for (const CommittedVariable& c : x.result->changed) {
      const server::VariableRecord* v = w->mirror().Find(c.name);
      auto last = versions_.find(c.name);
      if (v == nullptr || last == versions_.end()) continue;
      const bool agrees = v->version == c.version && v->checksum == c.checksum;
      if (!agrees || c.version <= last->second) {
        w->Fail("S4 version + 1",
                absl::StrCat("step ", step, ": ", c.name, " committed as v", c.version, " #",
                             c.checksum % 10000, " after v", last->second, "; the log has v",
                             v->version, " #", v->checksum % 10000));
      }
    }
  }
  for (int64_t h = 0; h < hosts; ++h) {
    const Heard& x = (*heard)[static_cast<size_t>(h)];
    if (!x.answered || !x.result.ok() || x.result->state != StepState::kCommitted) continue;
    for (const CommittedVariable& c : x.result->changed) {
      if (versions_.count(c.name)) versions_[c.name] = c.version;
      w->step_reads().Committed(c.name, c.version, c.checksum, x.answered_us);
    }
  }
  return true;
}

}  // namespace repvar::sim
