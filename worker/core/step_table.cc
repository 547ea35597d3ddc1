// SPDX-License-Identifier: Apache-2.0
#include "worker/core/step_table.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/random.h"
#include "common/base/status_util.h"
#include "common/base/sync.h"

namespace repvar::worker {
namespace {

constexpr size_t kKeepDoneSteps = 4;
// CommitAsync's calls that wait, at once; more queue.
constexpr int kMaxWaitingCommits = 64;

// "TPU:0" from "TPU:0" or "/job:j/replica:0/task:1/device:TPU:0".
std::string ShortDevice(const std::string& d) {
  auto pos = d.rfind("device:");
  return pos == std::string::npos ? d : d.substr(pos + 7);
}

absl::Status NotInStep(uint64_t variable_id, const StepInfo& header) {
  return absl::FailedPreconditionError(
      absl::StrCat("variable id ", variable_id, " is not in ", StepName(header),
                   " (variables created or initialized during a step join the next one)"));
}

absl::Status NoLongerOpen(const StepInfo& header) {
  return absl::FailedPreconditionError(
      absl::StrCat(StepName(header), " is no longer open on this worker (committed or aborted)"));
}

}  // namespace

std::string StepName(const StepInfo& header) {
  return absl::StrCat("step ", header.step, " (epoch ", header.epoch, ")");
}

StepResolution LocalFailure(const StepInfo& header, const absl::Status& status) {
  StepResolution r;
  r.step = header.step;
  r.epoch = header.epoch;
  r.state = StepState::kFailed;
  r.status = status;
  return r;
}

const StepVariable* StepLayout::Find(uint64_t id) const {
  auto it = vars.find(id);
  return it == vars.end() ? nullptr : &info.variables[it->second];
}

std::vector<int32_t> StepLayout::LocalReplicas(const StepVariable& var) const {
  std::vector<int32_t> out;
  if (me < 0) return out;
  for (size_t i = 0; i < var.replica_participant.size(); ++i) {
    if (var.replica_participant[i] == me) out.push_back(static_cast<int32_t>(i));
  }
  return out;
}

StepTable::StepTable(WorkerIdentity me, ReplicaStore* store, StepLink* link, Resolver* resolver,
                     Scheduler hasher)
    : me_(std::move(me)),
      store_(store),
      link_(link),
      resolver_(resolver),
      hasher_(std::move(hasher)) {
  if (!hasher_) {
    own_hasher_ = std::make_unique<ThreadPool>(static_cast<int>(me_.accelerators.size()));
    hasher_ = [e = own_hasher_.get()](std::function<void()> fn) { e->Schedule(std::move(fn)); };
  }
  waiting_ = std::make_unique<ThreadPool>(1, kMaxWaitingCommits);
}

StepTable::~StepTable() {
  waiting_.reset();  // runs the waiting commits out
  MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* resolving) { return *resolving == 0; }, &resolving_));
}

absl::StatusOr<std::shared_ptr<LocalStep>> StepTable::Find(int64_t step, uint64_t epoch) {
  if (epoch == 0) return absl::InvalidArgumentError("a step call needs the step's epoch");
  std::shared_ptr<const StepLayout> known;
  {
    MutexLock lock(&mu_);
    auto it = steps_.find(epoch);
    if (it != steps_.end()) {
      if (it->second->header.step != step) {
        return absl::InvalidArgumentError(absl::StrCat("epoch ", epoch, " belongs to step ",
                                                       it->second->header.step, ", not ", step));
      }
      return it->second;
    }
    known = layout_;
  }
  // Asked outside the lock: other trainers keep working meanwhile.
  REPVAR_ASSIGN_OR_RETURN(StepInfo info, link_->GetStep(epoch, known ? known->info.layout_id : 0));
  if (info.layout_omitted && (known == nullptr || known->info.layout_id != info.layout_id)) {
    REPVAR_ASSIGN_OR_RETURN(info, link_->GetStep(epoch, 0));  // raced with another layout
  }
  if (info.step != step) {
    return absl::InvalidArgumentError(
        absl::StrCat("epoch ", epoch, " belongs to step ", info.step, ", not ", step));
  }
  auto s = std::make_shared<LocalStep>();
  if (info.layout_omitted) {
    s->layout = known;
  } else {
    REPVAR_ASSIGN_OR_RETURN(s->layout, ParseLayout(info));
  }
  if (info.state == StepState::kCommitted || info.state == StepState::kFailed) {
    s->phase = LocalStep::Phase::kDone;  // a late trainer: it gets the resolution
  }
  s->header = std::move(info);

  MutexLock lock(&mu_);
  return AddLocked(epoch, std::move(s));
}

std::shared_ptr<LocalStep> StepTable::AddLocked(uint64_t epoch, std::shared_ptr<LocalStep> s) {
  auto [it, fresh] = steps_.emplace(epoch, s);
  if (!fresh) return it->second;  // another trainer got there first
  layout_ = s->layout;
  // One step is open at a time: an older open one was aborted or failed.
  for (auto& [e, other] : steps_) {
    if (e < epoch && other->phase == LocalStep::Phase::kOpen) {
      CloseLocked(e, *other,
                  LocalFailure(other->header,
                               absl::AbortedError(absl::StrCat("superseded by epoch ", epoch))));
    }
  }
  while (steps_.size() > kKeepDoneSteps &&
         steps_.begin()->second->phase == LocalStep::Phase::kDone) {
    steps_.erase(steps_.begin());
  }
  cv_.SignalAll();
  return s;
}

void StepTable::CloseLocked(uint64_t epoch, LocalStep& s, StepResolution resolution) {
  for (auto it = leases_.begin(); it != leases_.end();) {
    it = it->second.epoch == epoch ? leases_.erase(it) : std::next(it);
  }
  s.written.clear();
  s.resolution = std::move(resolution);
  s.phase = LocalStep::Phase::kDone;
  cv_.SignalAll();
}

void StepTable::Hint(int64_t step, uint64_t epoch, uint64_t layout_id,
                     absl::Duration barrier_timeout) {
  if (epoch == 0 || layout_id == 0) return;
  MutexLock lock(&mu_);
  if (steps_.contains(epoch) || layout_ == nullptr || layout_->info.layout_id != layout_id) {
    return;
  }
  if (!steps_.empty() && steps_.rbegin()->first > epoch) return;  // an old step: ask
  auto s = std::make_shared<LocalStep>();
  s->header.step = step;
  s->header.epoch = epoch;
  s->header.state = StepState::kOpen;
  s->header.barrier_timeout = barrier_timeout;
  s->header.layout_id = layout_id;
  s->layout = layout_;
  AddLocked(epoch, std::move(s));
}

absl::StatusOr<std::shared_ptr<const StepLayout>> StepTable::ParseLayout(StepInfo& info) const {
  auto layout = std::make_shared<StepLayout>();
  layout->info.layout_id = info.layout_id;
  layout->info.participants = std::move(info.participants);
  layout->info.variables = std::move(info.variables);
  info.participants.clear();
  info.variables.clear();
  const std::vector<StepParticipant>& participants = layout->info.participants;
  for (size_t i = 0; i < participants.size(); ++i) {
    const StepParticipant& p = participants[i];
    if (p.task.job == me_.job && p.task.task == me_.task) {
      if (p.incarnation_digest != IncarnationDigest(me_.incarnation)) {
        return absl::AbortedError(absl::StrCat(
            StepName(info), " counts another incarnation of this worker, not ", me_.incarnation));
      }
      layout->me = static_cast<int32_t>(i);
    }
  }
  for (size_t i = 0; i < layout->info.variables.size(); ++i) {
    layout->vars[layout->info.variables[i].id] = static_cast<int>(i);
  }
  return std::shared_ptr<const StepLayout>(std::move(layout));
}

absl::Status StepTable::CheckWrite(const LocalStep& s, const WriteItem& item) const {
  const StepVariable* var = s.layout->Find(item.variable_id);
  if (var == nullptr) return NotInStep(item.variable_id, s.header);
  if (item.replica < 0 || static_cast<size_t>(item.replica) >= var->replica_participant.size()) {
    return absl::NotFoundError(absl::StrCat(var->name, " has no replica ", item.replica));
  }
  if (var->replica_participant[item.replica] != s.layout->me || s.layout->me < 0) {
    if (store_->Get(item.variable_id, item.replica).ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat(var->name, "/", item.replica, " sits ", StepName(s.header),
                       " out (it was not up to date when the step began)"));
    }
    return absl::NotFoundError(
        absl::StrCat(var->name, "/", item.replica, " is not held by this worker"));
  }
  if (item.value == nullptr || !(item.value->spec == var->spec)) {
    return absl::InvalidArgumentError(
        absl::StrCat(var->name, " is ", var->spec.ToString(), "; the value is ",
                     item.value == nullptr ? std::string("missing") : item.value->spec.ToString()));
  }
  return absl::OkStatus();
}

absl::Status StepTable::Write(int64_t step, uint64_t epoch, std::vector<WriteItem> items) {
  REPVAR_ASSIGN_OR_RETURN(std::shared_ptr<LocalStep> s, Find(step, epoch));
  MutexLock lock(&mu_);
  if (s->phase != LocalStep::Phase::kOpen) return NoLongerOpen(s->header);
  for (const WriteItem& item : items) REPVAR_RETURN_IF_ERROR(CheckWrite(*s, item));
  for (WriteItem& item : items) {
    const std::pair<uint64_t, int32_t> key{item.variable_id, item.replica};
    s->hashing.erase(key);  // a value still being hashed is replaced, not awaited
    s->written[key] = std::move(item.value);
  }
  return absl::OkStatus();
}

absl::StatusOr<StepTable::Lease> StepTable::Map(int64_t step, uint64_t epoch, uint64_t variable_id,
                                                int32_t replica, bool write, bool initialize) {
  REPVAR_ASSIGN_OR_RETURN(std::shared_ptr<LocalStep> s, Find(step, epoch));
  const StepVariable* var = s->layout->Find(variable_id);
  if (var == nullptr) return NotInStep(variable_id, s->header);
  Lent lent{step, epoch, variable_id, replica, write, nullptr, nullptr};
  int64_t version = 0;
  if (!write) {
    REPVAR_ASSIGN_OR_RETURN(StoredReplica view, Read(epoch, variable_id, replica));
    version = view.version;
    if (view.value->bytes.shared_fd() >= 0) {
      lent.value = std::move(view.value);  // already shared: lent as it is, no copy
    } else {
      REPVAR_ASSIGN_OR_RETURN(Buffer buf, Buffer::AllocateShared(view.value->bytes.size()));
      auto copy = std::make_shared<Tensor>();
      copy->spec = view.value->spec;
      copy->bytes = std::move(buf);
      std::memcpy(copy->bytes.data(), view.value->bytes.data(), copy->bytes.size());
      copy->checksum = view.checksum;
      lent.value = std::move(copy);
    }
  } else {
    REPVAR_ASSIGN_OR_RETURN(int64_t bytes, var->spec.ByteSize());
    REPVAR_ASSIGN_OR_RETURN(Buffer buf, Buffer::AllocateShared(static_cast<size_t>(bytes)));
    lent.writable = std::make_shared<Tensor>();
    lent.writable->spec = var->spec;
    lent.writable->bytes = std::move(buf);
    {
      // A write lease must name a replica this trainer may write in this step.
      MutexLock lock(&mu_);
      if (s->phase != LocalStep::Phase::kOpen) return NoLongerOpen(s->header);
      REPVAR_RETURN_IF_ERROR(CheckWrite(*s, WriteItem{variable_id, replica, lent.writable}));
    }
    if (initialize) {
      REPVAR_ASSIGN_OR_RETURN(StoredReplica view, Read(epoch, variable_id, replica));
      std::memcpy(lent.writable->bytes.data(), view.value->bytes.data(),
                  lent.writable->bytes.size());
      lent.writable->checksum = view.checksum;
      version = view.version;
    }
  }
  const Tensor& t = write ? *lent.writable : *lent.value;
  MutexLock lock(&mu_);
  Lease lease{next_lease_++, t.bytes.shared_fd(), t.bytes.size(), t.checksum, version};
  leases_[lease.id] = std::move(lent);
  return lease;
}

absl::StatusOr<uint64_t> StepTable::Unmap(uint64_t lease, bool publish,
                                          std::optional<uint64_t> checksum, bool hash_later) {
  Lent lent;
  {
    MutexLock lock(&mu_);
    auto it = leases_.find(lease);
    if (it == leases_.end()) return absl::NotFoundError(absl::StrCat("no lease ", lease));
    lent = std::move(it->second);
    leases_.erase(it);
  }
  if (!publish) return lent.write ? lent.writable->checksum : lent.value->checksum;
  if (!lent.write) return absl::InvalidArgumentError("only a write lease can be published");
  if (hash_later && !checksum) {
    REPVAR_ASSIGN_OR_RETURN(std::shared_ptr<LocalStep> s, Find(lent.step, lent.epoch));
    const std::pair<uint64_t, int32_t> key{lent.variable_id, lent.replica};
    uint64_t number = 0;
    {
      MutexLock lock(&mu_);
      if (s->phase != LocalStep::Phase::kOpen) return NoLongerOpen(s->header);
      REPVAR_RETURN_IF_ERROR(CheckWrite(*s, WriteItem{key.first, key.second, lent.writable}));
      number = next_publish_++;
      s->hashing[key] = number;  // an earlier one still being hashed is replaced
    }
    hasher_([this, s, key, number, value = std::move(lent.writable)] {
      FinishHashing(s, key, number, value);
    });
    return 0;
  }
  if (checksum) {
    lent.writable->checksum = *checksum;  // hashed by the trainer as it wrote
  } else {
    lent.writable->UpdateChecksum();  // the trainer wrote the bytes in place
  }
  const uint64_t sum = lent.writable->checksum;
  REPVAR_RETURN_IF_ERROR(
      Write(lent.step, lent.epoch,
            {WriteItem{lent.variable_id, lent.replica, std::move(lent.writable)}}));
  return sum;
}

void StepTable::FinishHashing(const std::shared_ptr<LocalStep>& s, std::pair<uint64_t, int32_t> key,
                              uint64_t publish, const std::shared_ptr<Tensor>& value) {
  value->UpdateChecksum();  // outside the lock: the table goes on meanwhile
  MutexLock lock(&mu_);
  auto it = s->hashing.find(key);
  if (it == s->hashing.end() || it->second != publish) return;  // replaced meanwhile
  s->hashing.erase(it);
  // A step discarded or superseded meanwhile drops it, as it dropped the rest.
  if (s->phase == LocalStep::Phase::kOpen) s->written[key] = value;
  cv_.SignalAll();
}

void StepTable::AwaitHashedLocked(const LocalStep& s,
                                  std::optional<std::pair<uint64_t, int32_t>> key) {
  // Hashing always ends (one pass over bytes in memory): no deadline.
  while (key ? s.hashing.contains(*key) : !s.hashing.empty()) {
    ++hash_waiters_;
    cv_.Wait(&mu_);
    --hash_waiters_;
  }
}

int StepTable::HashWaiters() const {
  MutexLock lock(&mu_);
  return hash_waiters_;
}

absl::StatusOr<StoredReplica> StepTable::Read(uint64_t epoch, uint64_t variable_id,
                                              int32_t replica) {
  REPVAR_ASSIGN_OR_RETURN(StoredReplica r, store_->Get(variable_id, replica));
  if (epoch == 0) return r;
  MutexLock lock(&mu_);
  auto it = steps_.find(epoch);
  if (it == steps_.end()) return r;                    // nothing written in that step here
  const std::shared_ptr<LocalStep> held = it->second;  // the wait below may unlock
  const LocalStep& s = *held;
  AwaitHashedLocked(s, std::pair{variable_id, replica});
  if (s.phase == LocalStep::Phase::kOpen) {
    auto w = s.written.find({variable_id, replica});
    if (w != s.written.end()) {
      r.value = w->second;
      r.checksum = w->second->checksum;
    }
  }
  return r;
}

absl::StatusOr<std::vector<std::string>> StepTable::LocalDevices(
    const std::vector<std::string>& devices) const {
  std::vector<std::string> mine;
  for (const std::string& d : devices) {
    std::string shortname = ShortDevice(d);
    if (std::find(me_.accelerators.begin(), me_.accelerators.end(), shortname) ==
        me_.accelerators.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("device ", d, " is not an accelerator of ", me_.job, ":", me_.task));
    }
    mine.push_back(shortname);
  }
  if (devices.empty()) mine = me_.accelerators;
  return mine;
}

void StepTable::ResolveThenClose(std::shared_ptr<LocalStep> s, CommitDone done) {
  {
    MutexLock lock(&mu_);
    ++resolving_;
  }
  unsettled_.fetch_add(1);
  if (s->layout->me >= 0) {
    for (const StepVariable& var : s->layout->info.variables) {
      const std::vector<int32_t> local = s->layout->LocalReplicas(var);
      if (local.empty()) continue;
      if (auto r = store_->Get(var.id, local.front()); r.ok())
        s->begin_versions[var.id] = r->version;
    }
  }
  const LocalStep& step = *s;
  resolver_->ResolveAsync(
      step, [this, s = std::move(s), done = std::move(done)](StepResolution res) mutable {
        StepResolution out;
        {
          MutexLock lock(&mu_);
          CloseLocked(s->header.epoch, *s, std::move(res));
          out = *s->resolution;
          unsettled_.fetch_sub(1);
          --resolving_;  // the last use of the table
        }
        std::move(done)(std::move(out));
      });
}

bool StepTable::EnterLocked(LocalStep& s, const std::vector<std::string>& mine) {
  if (s.phase != LocalStep::Phase::kOpen) return false;
  s.committed.insert(mine.begin(), mine.end());
  if (s.committed.size() < me_.accelerators.size()) return false;
  s.phase = LocalStep::Phase::kResolving;  // its copies are the resolver's now
  return true;
}

void StepTable::CommitAsync(int64_t step, uint64_t epoch, std::vector<std::string> devices,
                            absl::Time deadline, CommitDone done) {
  absl::StatusOr<std::vector<std::string>> mine = LocalDevices(devices);
  if (!mine.ok()) {
    std::move(done)(mine.status());
    return;
  }
  std::shared_ptr<LocalStep> s;
  bool run = false;
  {
    MutexLock lock(&mu_);
    auto it = steps_.find(epoch);
    // Known here, and nothing published still being hashed: it enters now.
    if (it != steps_.end() && it->second->header.step == step && it->second->hashing.empty()) {
      s = it->second;
      run = EnterLocked(*s, *mine);
    }
  }
  if (run) {
    ResolveThenClose(std::move(s), std::move(done));
  } else if (s != nullptr) {  // entered: it waits for the host's other devices
    waiting_->Schedule([this, s = std::move(s), deadline, done = std::move(done)]() mutable {
      std::move(done)(AwaitResolution(*s, deadline));
    });
  } else {
    waiting_->Schedule([this, step, epoch, devices = std::move(devices), deadline,
                        done = std::move(done)]() mutable {
      std::move(done)(Commit(step, epoch, devices, deadline));
    });
  }
}

absl::StatusOr<StepResolution> StepTable::Commit(int64_t step, uint64_t epoch,
                                                 const std::vector<std::string>& devices,
                                                 absl::Time deadline) {
  REPVAR_ASSIGN_OR_RETURN(std::shared_ptr<LocalStep> s, Find(step, epoch));
  REPVAR_ASSIGN_OR_RETURN(std::vector<std::string> mine, LocalDevices(devices));
  bool run = false;
  {
    MutexLock lock(&mu_);
    AwaitHashedLocked(*s);  // every value published here is in the report
    run = EnterLocked(*s, mine);
  }
  if (!run) return AwaitResolution(*s, deadline);
  Notification closed;
  StepResolution out;
  ResolveThenClose(s, [&](absl::StatusOr<StepResolution> r) {
    out = *std::move(r);  // always a resolution
    closed.Notify();
  });
  closed.WaitForNotification();
  return out;
}

absl::StatusOr<StepResolution> StepTable::AwaitResolution(const LocalStep& s, absl::Time deadline) {
  {
    MutexLock lock(&mu_);
    while (s.phase != LocalStep::Phase::kDone) {
      if (cv_.WaitWithDeadline(&mu_, deadline)) {
        std::vector<std::string> waiting;
        for (const std::string& a : me_.accelerators) {
          if (!s.committed.contains(a)) waiting.push_back(a);
        }
        return absl::DeadlineExceededError(
            absl::StrCat(StepName(s.header), ": no resolution in time",
                         waiting.empty() ? "" : "; devices of this host not committed yet: ",
                         absl::StrJoin(waiting, ", ")));
      }
    }
    if (s.resolution) return *s.resolution;
  }
  // The step was already over when this worker first heard of it (a late
  // trainer): the coordinator has its resolution, whole (nothing of it was
  // installed here to list).
  auto r = link_->WaitStep(s.header.epoch, absl::Seconds(5), /*whole=*/true);
  if (r.ok()) return *std::move(r);
  return LocalFailure(s.header, absl::AbortedError("the step was discarded on this worker"));
}

void StepTable::Discard(uint64_t epoch) {
  MutexLock lock(&mu_);
  auto it = steps_.find(epoch);
  if (it == steps_.end() || it->second->phase != LocalStep::Phase::kOpen) return;
  CloseLocked(epoch, *it->second,
              LocalFailure(it->second->header, absl::AbortedError("a trainer aborted the step")));
}

}  // namespace repvar::worker
